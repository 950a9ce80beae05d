"""Messages and protocols: the envelope (pass 1) and the body (pass 2), descriptors and
their schemas, conversations and the evaluator, the registry, trust, the JSON mapping,
compatibility and hints. Private: its public names are re-exported by :mod:`cbcl`,
:mod:`cbcl.trust`, :mod:`cbcl.descriptor`, :mod:`cbcl.conversation` and
:mod:`cbcl.json_mapping`."""
