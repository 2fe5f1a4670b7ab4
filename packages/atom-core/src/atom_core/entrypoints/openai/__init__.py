"""The OpenAI-compatible server: app.py (routes, auth, errors), protocol.py (request bodies), chat.py
(chat template -> token ids), responses.py and streaming.py (response shapes), limits.py and
connections.py (what a client may hold). Import from those modules: this one stays cheap to import."""
