"""What a federation tells its user, read from its directory alone: the per-round table
(rounds.md, rounds.json, rounds.png; buffered rounds: the versions table, `buffered_table`), the cost plan of the rounds still to run (`--plan`), and each
round's time over a measured link (`--plan --link`)."""
