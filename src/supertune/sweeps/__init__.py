"""Scaling sweeps and their reports: `supertune sweep` (one run of the same config per scale) and
`supertune report` (a markdown table, report.json and plots of a sweep's runs or of run directories).

What a single run measures is `supertune.telemetry`'s; this package reads what runs wrote. Import the
submodules directly (`supertune.sweeps.sweep`): matplotlib is imported only when plots are drawn.
"""
