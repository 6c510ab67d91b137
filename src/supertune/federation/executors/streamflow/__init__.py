"""The StreamFlow executor: each round written as a CWL workflow (`cwl`) and run by `streamflow run`
(`executor`, the executable found by `command`), where each site's files are (`site_places`), a
login site's config checked there (`site_check`); the round's outputs checked (`round_outputs`);
the site-task entry its steps run at the sites (`site_task`); what its train steps came to and cost
(`outcomes`)."""
