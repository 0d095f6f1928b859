"""The `armature` command (`cli.main`): one module per subcommand. A command module parses its
flags, builds its typed configuration (config.py) and hands it to the code that runs; it holds
no serving logic. User mistakes end with one line on stderr and exit code 2."""
