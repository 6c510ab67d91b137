"""The site agents executor: the coordinator on this machine (`coordinator`) and the agent at each
site (`site_agent`, as a chain of SLURM jobs: `agent_chain`, the agent-link entry `agent_link`),
meeting at an exchange whose file names are `exchange_layout`'s and whose waits are
`exchange_wait`'s."""
