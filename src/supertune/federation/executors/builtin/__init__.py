"""The built-in executor: a site's work in local processes or as a SLURM job this machine submits
(buffered rounds: every local site's processes at once); the site-eval entry a SLURM site's
evaluation job runs."""
