"""The `specdec` command: main.py (generate, models, the subcommand registry), common.py (options
shared by subcommands), chat.py, convert.py, lossless_check.py (`specdec verify`)."""
