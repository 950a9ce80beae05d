"""Grammars: the safe subset descriptors may use, the CFG and its LR(1)/LALR(1) analysis
with counterexamples, the LALR tables and the kernel that drives them, and the guarded
compile worker. Knows values and errors (:mod:`cbcl.core`), nothing of messages. Private."""
