"""One module per ``dpteach`` subcommand."""
