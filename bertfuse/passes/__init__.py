"""Graph passes: one fusion or clean-up per module, run in order by manager.py.

The protocol every pass follows (base.py, match.py):

* a pass is a callable with a ``name`` that takes an onnx-graphsurgeon graph and returns a
  ``PassResult``; which passes run, in which order, is a plan (plans.py);
* a pass with candidates (the anchors of its pattern) subclasses ``CandidatePass``, which owns
  the loop: the pass says which nodes are its candidates (``candidates``), how to match one
  (``match``: returns what the rewrite needs, or raises ``MatchFailure`` through
  ``fail(reason)`` / ``expect(cond, reason)``) and how to rewrite it (``rewrite``); the loop
  ends every candidate as fused or missed with the reason, in its encoder layer (``Layers``);
* a pass that decides the whole graph at once (fp16, hidden_3d, packing) implements ``Pass``
  directly and still ends what it looked at as fused or missed;
* a fused node is built through its op contract (``bertfuse.ops``: ``CONTRACT.node(...)``), which
  checks its slots and attributes against what ONNX Runtime's kernel takes.

How to add a fusion:

1. Write the subgraph it matches as an ASCII drawing in the new module's docstring, and say
   what its candidates are.
2. Find candidates by structure; decide by math where exporters differ (evaluate.py, probe.py).
3. Subclass ``CandidatePass``; fail the match with a reason a user can act on, naming the node.
4. Build the fused node with the op's contract; add the contract to ``bertfuse.ops`` first if
   the op is new (with its NumPy reference and a test against ORT's kernel).
5. Put the pass in ``plans.fusion_plan`` where its inputs exist (later fusions match on
   earlier ones' output).
6. Add ``tests/unit/passes/test_<module>.py``: a tiny graph in the TF shape, the operand-swapped
   form, an intermediate read outside (must not fuse), a wrong constant (must not fuse), each
   run with ORT before and after and its ops counted.
"""
