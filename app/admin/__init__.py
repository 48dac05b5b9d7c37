"""Administration of user accounts over HTTP (the CLI's `users` commands do the same from a shell)."""
