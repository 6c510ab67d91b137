"""The StreamFlow executor: each round written as a CWL workflow (`cwl`) and run by `streamflow run`
(`executor`); the site-task entry its steps run at the sites (`site_task`); what its train steps
came to and cost (`outcomes`)."""
