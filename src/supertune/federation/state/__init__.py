"""What a federation directory holds and says: its layout (rounds, sites, global models), the receipts
that say which phase of which round is done (written atomically, checked when read back), who owns a
site's folder, the history of dropped sites and failures, every attempt's cost, the site configs
kept, and the bytes of the models in it."""
