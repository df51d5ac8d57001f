"""Ray measurement cluster, run logs, the search job and the command line."""
