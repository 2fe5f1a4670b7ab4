"""The OpenAI-compatible server: app.py (assembles the app), routes.py (the handlers), state.py (what they
serve), protocol.py (request bodies) and validation.py (checks beyond them), chat.py (chat template ->
token ids), generation.py (a request run to its answer), responses.py and streaming.py (response shapes),
errors.py (OpenAI's error envelope), access.py (API key, access log), limits.py and connections.py (what a
client may hold). Import from those modules: this one stays cheap to import."""
