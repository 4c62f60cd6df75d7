"""The CLI's side of a running `bradley serve`: the store it reads and writes over HTTP, and the
commands that go through the server (`bradley --server URL ...`)."""
