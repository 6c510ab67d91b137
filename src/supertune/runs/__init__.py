"""Starting a run and waiting for it, on this machine or as a SLURM job: the one place that does it.

- `run_dir_choice`: the run directory of a start (a new one, or the unfinished run to resume).
- `local`: training here or under torchrun in the foreground (`supertune train`), or in processes of
  their own with a log (the sweep's scales, a federation's local sites); stop signals; exit codes.
- `slurm`: the job script checked, the run prepared and submitted, the job id recorded; a run whose
  job is still queued is refused (or its job kept); a job script run inside an allocation.
- `wait`: the one loop that waits for SLURM jobs.

The CLI, the sweep and the federation call these in-process; the only processes started here are
training's own. Importing this package imports nothing heavy.
"""
