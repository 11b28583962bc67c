"""Graph passes: one fusion or clean-up per module, run in order by manager.py.

The protocol every pass follows (base.py):

* a pass is a callable with a ``name`` that takes an onnx-graphsurgeon graph and returns a
  ``PassResult``;
* it looks at candidates (the anchors of its pattern), tries a match on each, a
  ``MatchResult`` that a failed check ends with ``.fail(reason)``, and ends every candidate
  as fused (``result.fused``) or missed (``result.record`` / ``result.missed``), with the
  encoder layer from ``Layers`` where one is known;
* a fused node is built through its op contract (``custom_ops``: ``CONTRACT.node(...)``), which
  checks its slots and attributes against what ONNX Runtime's kernel takes.

How to add a fusion:

1. Write the subgraph it matches as an ASCII drawing in the new module's docstring, and say
   what its candidates are.
2. Find candidates by structure; decide by math where exporters differ (evaluate.py, probe.py).
3. Return a ``MatchResult`` from the match; fail it with a reason a user can act on.
4. Build the fused node with the op's contract; add the contract to ``custom_ops`` first if the
   op is new (with its NumPy reference and a test against ORT's kernel).
5. Put the pass in ``manager.default_passes`` where its inputs exist (later fusions match on
   earlier ones' output).
6. Add ``tests/unit/passes/test_<module>.py``: a tiny graph in the TF shape, the operand-swapped
   form, an intermediate read outside (must not fuse), a wrong constant (must not fuse), each
   run with ORT before and after and its ops counted.
"""
