"""The trace recorder's parts, composed by `proxy.recorder.TraceRecorder` (the one entry point).

`content` decides what a trace keeps of an event (record_content, redaction, truncation), `runs` is
the registry of runs in memory and what their run.json / tripwire.json say, `writer` puts queued
lines and metadata on disk off the request path, and `recovery` closes runs left "running" by
processes that are gone.
"""
