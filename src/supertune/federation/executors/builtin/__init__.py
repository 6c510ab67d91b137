"""The built-in executor: a site's work in local processes or as a SLURM job this machine submits;
the site-eval entry a SLURM site's evaluation job runs."""
