"""What atom-core's tests share, one module a concept: tiny configs (architectures), checkpoints written
for a test (checkpoints), transformers references (references), oracle drafts (drafts), engine helpers
(engine), sockets (network), the openai client on an in-process app (openai_client), a harmony-format
checkpoint (harmony), the model-runner driver (runner_driver) and the silent-flood client
(silent_flood, run as a script).

pytest imports test files with --import-mode=importlib, so conftest.py puts the tests folder on sys.path
and tests import `core_fixtures.<module>`; worker processes a test spawns inherit that sys.path.
"""
