"""The `supertune` command line: a table of subcommands, each a thin module."""
