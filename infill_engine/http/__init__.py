"""The team server: the engine over HTTP (llama.cpp's `/infill` and diffill's own endpoints), its client, and its
Ray Serve deployment.

`app` is the ASGI application, `llama` the mapping of llama.cpp's `/infill`, `client` the `Engine` that talks to a
server (the language server's `engine.mode: "remote"`), `command` is `diffill http`, and `ray_serve` deploys the
application on Ray Serve. Importing this package imports neither torch nor uvicorn nor ray.
"""
