"""The serving engine: sequences, block manager, scheduler, model runner, sync and async engines.

Import the pieces from their modules (``cloud_server.engine.async_engine`` ...); this package
imports nothing heavy at import time.
"""
