"""The executors that carry out what is left of a round, one package each, started through their
records in federation.config.executors:

- builtin: local processes and SLURM jobs on clusters this machine submits to;
- streamflow: each round as one StreamFlow workflow, its steps run the site-task entry at the sites;
- agents: the coordinator here and an agent at each site, meeting at an exchange.

The agents' sites run their work with the built-in executor, so `agents` stands above `builtin`."""
