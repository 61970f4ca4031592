"""The shared engine service: one model per user and machine, served to many language servers over a local socket.

Layers, each its own small module (after pynvim's `msgpack_rpc/`):

    stream.py    bytes over a connected socket
    framing.py   length-prefixed msgpack frames with a maximum size
    session.py   RPC: request ids -> futures, notifications, error replies for malformed frames
    wire.py      InfillRequest / InfillResult <-> plain msgpack dicts (the only conversion)
    api.py       the typed client: `EngineClient.fill(request, on_step)` works like `InfillEngine.fill`
    server.py    `diffill engine serve`: loads the model once, schedules fairly across clients
    address.py   where the socket lives (a private runtime directory), TCP address rules
    launcher.py  the language server's side: connect, or start a detached engine; restart once if it dies

Nothing here imports pygls; the client side (stream, framing, session, wire, api, address, launcher) never imports
torch.
"""
