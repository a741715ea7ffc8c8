"""MongoDB wire protocol: sans-I/O codec, command dispatch, asyncio server."""
