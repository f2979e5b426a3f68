"""The one pipeline (``polyad.pipeline``) and the target seam (``polyad.target``).

- options and the target registry reject what does not exist, saying what does;
- the schedule stage states facts only: no module of ``polyad.schedule``
  imports a later stage or names OpenMP, and its result does not depend on
  the target beyond the schedule the target's score picks;
- the OpenMP plan is what the C says: every planned loop's directive line
  sits right before its loop, under the iterator name the plan chose.
"""

import ast
import json
import re
from pathlib import Path

import pytest

import polyad as pa
from polyad import target
from polyad.emit.cexpr import C99, CPrinter, Dialect
from polyad.pipeline import Options, compile_kernel
from polyad.schedule import ast_children, schedule_kernel
from test_streaming import without_streamed_branches
from tv_kernel import tv_cost

M, N, K = pa.sizes("M N K")
PACKAGE = Path(pa.__file__).parent


@pa.kernel
def filter_gradient(x: pa.f64[M, N], dy: pa.f64[M, N], df: pa.Out(pa.f64[K])):
    for m in range(M):
        for n in range(N - K):
            for k in range(K):
                df[k] += x[m, n + k] * dy[m, n]


@pa.kernel
def histogram(x: pa.f64[N], h: pa.Out(pa.f64[N])):
    for i in range(N):
        h[i // 2] += x[i]
        h[(i + 1) // 2] += 0.5 * x[i]


@pa.kernel
def squares(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        t = x[i] * x[i]
        y[i] = t + 1.0


@pa.kernel
def prefix(y: pa.f64[N]):
    for i in range(1, N):
        y[i] += y[i - 1]


KERNELS = [tv_cost, filter_gradient, histogram, squares, prefix,
           pa.grad(tv_cost, wrt="g")]


def test_options_and_target_registry():
    assert target.TARGETS == ("openmp", "cuda", "cuda-sim")
    assert target.PLANNED_TARGETS == ()
    with pytest.raises(ValueError, match="unknown target 'metal'; choose one of openmp, cuda"):
        Options(target="metal")
    with pytest.raises(ValueError, match="sanitize must be None or 'address'"):
        Options(sanitize="thread")
    assert Options(deterministic=1) == Options(deterministic=True)
    assert Options(sanitize="address").source_options == Options()


def test_compile_and_artifact_share_one_compilation():
    k = pa.Kernel(ir_kernel=tv_cost.ir)
    art = k.artifact(Options())
    assert k.artifact(Options(sanitize="address")) is art     # the toolchain option shares it
    assert k.compile().source == art.source
    assert art.signature.name == "tv_cost"
    assert art.source == compile_kernel(tv_cost.ir).source    # deterministic text


def _imports(path: Path) -> set:
    """The polyad top-level modules a module of a subpackage imports (``from ..x``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 2:
            out.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
    return out


def test_loop_tree_is_a_shared_middle_stage():
    """The loop tree sits right after the IR: ad/, other targets and frontends may use it."""
    tree = ast.parse((PACKAGE / "looptree.py").read_text())
    imported = {(n.level, n.module) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m for level, m in imported if level > 0} == {None}  # only ``from . import ir``
    assert not (PACKAGE / "ad" / "tree.py").exists()


def test_schedule_stage_names_no_target():
    later = {"target", "emit", "pipeline", "runtime", "api", "report", "build", "cli"}
    for path in sorted((PACKAGE / "schedule").glob("*.py")):
        assert not (_imports(path) & later), f"{path.name} imports a later stage"
        text = path.read_text().lower()
        for word in ("omp", "openmp", "pragma", "simd"):
            assert not re.search(rf"\b{word}\b", text), f"{path.name} mentions {word!r}"


def test_loop_facts_classify_carried_dependences():
    def facts(k):
        sk = schedule_kernel(k.ir, lambda cand: (0, 0))  # keep program order
        return sorted(sk.loops.values(), key=lambda f: f.depth)

    (f,) = [f for f in facts(filter_gradient) if f.depth == 0]
    assert f.parallel and set(f.scatters) == {"df"} and f.scatters["df"].small
    (f,) = facts(histogram)
    assert f.parallel and not f.scatters["h"].small and f.trip_count_bound is None
    (f,) = facts(squares)
    assert f.parallel and f.private == ("t",) and not f.carried
    (f,) = facts(prefix)
    assert not f.parallel and f.why_not_parallel == "'y' has loop-carried flow dependences"
    k_loop = [f for f in facts(filter_gradient) if f.depth == 2]
    assert all(f.trip_count_bound is None for f in k_loop)  # K is a size: unbounded


def _planned_in_order(plan, node, out):
    lp = plan.loop(node)
    if lp is not None:
        out.append(lp)
    for child in ast_children(node):
        _planned_in_order(plan, child, out)
    return out


@pytest.mark.parametrize("k", KERNELS, ids=lambda k: k.ir.name)
def test_plan_and_c_agree(k):
    """Each C loop is a plan entry, in order: its iterator and its directive line."""
    art = k.artifact(Options())
    names = art.plan.names
    printer = CPrinter(art.scheduled.kernel, array_names=names)
    # (a loop whose stores go past the caches where its array is large is printed twice:
    # as written, and in a branch of its own, in vectors of lanes)
    lines = without_streamed_branches(art.source).split("\n")
    fors = [n for n, line in enumerate(lines) if line.strip().startswith("for (int64_t ")]
    planned = _planned_in_order(art.plan, art.scheduled.ast, [])
    assert len(fors) == len(planned) == len(art.plan.loops)
    for n, lp in zip(fors, planned):
        assert lines[n].strip().startswith(f"for (int64_t {lp.iterator} = ")
        pragma = lp.pragma(names, lambda e: printer.expr(e, names))
        before = lines[n - 1].strip()
        assert before == pragma if pragma is not None else not before.startswith("#pragma")
        assert lp.decision().startswith("omp " + (lp.directive() or "")) == \
            (lp.directive() is not None)
    report = pa.explain(k, format="json")
    assert [lp.iterator for lp in planned] == \
        [loop["iterator"] for loop in json.loads(report)["loops"]]


def test_dialect_spells_the_c():
    class Prefixed(Dialect):
        def atomic_update(self, target, op, value):
            return [f"my_atomic_add(&{target}, {value});"]

    d = Prefixed(name="test", restrict="__restrict__", function_qualifier="static __inline__")
    t = target.get_target("openmp")
    art = compile_kernel(histogram.ir)
    from polyad.emit.c_openmp import emit_c, signature
    text = emit_c(art.plan, d)
    assert "my_atomic_add(&h[" in text and "#pragma omp atomic" not in text
    assert "__restrict__" in signature(histogram.ir, d).declaration()
    assert emit_c(art.plan, C99) == art.source == t.emit(art.plan)


@pytest.mark.parametrize("k", KERNELS, ids=lambda k: k.ir.name)
def test_one_isl_context_per_compilation(k, monkeypatch):
    """Every pass of one compilation works in one isl.Context; a pass's model of its result
    keeps the domains of the statements it did not change."""
    import islpy as isl

    contexts = []
    fresh = isl.Context

    def counted():
        contexts.append(fresh())
        return contexts[-1]

    monkeypatch.setattr(isl, "Context", counted)
    art = compile_kernel(k.ir, Options())
    assert len(contexts) == 1 and art.scheduled.model.ctx is contexts[0]
    model = art.scheduled.model
    kept = [st for st in art.scheduled.kernel.statements if st in k.ir.statements]
    again = model.for_kernel(k.ir)
    assert again.ctx is model.ctx
    for st in kept:
        assert again.domain(st) is model.domain(st)


def test_internal_failure_names_stage_statement_and_line(monkeypatch):
    """A bug escaping a pass is a pa.InternalError naming the DSL statement, chaining it."""
    from polyad.schedule import gather

    def broken(st, at, model, outer=0):
        raise KeyError("boom")

    monkeypatch.setattr(gather, "_invert", broken)
    with pytest.raises(pa.InternalError) as info:
        compile_kernel(histogram.ir, Options())
    err, s0 = info.value, histogram.ir.statements[0]
    assert isinstance(err.__cause__, KeyError)
    assert (err.stage, err.kernel, err.statement, err.line) == \
        ("scheduling", "histogram", s0.name, s0.line)
    assert str(err).startswith(f"{histogram.ir.filename}:{s0.line}: internal error in polyad "
                               f"while scheduling statement {s0.name} ({s0.source})")
    assert "KeyError: 'boom'" in str(err) and "bug in polyad" in str(err)


def test_internal_failure_while_differentiating(monkeypatch):
    from polyad.ad import reverse

    def broken(*args, **kwargs):
        raise TypeError("bad partial")

    monkeypatch.setattr(reverse, "partials", broken)
    with pytest.raises(pa.InternalError) as info:
        pa.grad(squares_sum, wrt="x").ir
    err = info.value
    assert err.stage == "differentiating" and isinstance(err.__cause__, TypeError)
    assert err.statement is not None and err.line > squares_sum.ir.line


@pa.kernel
def squares_sum(x: pa.f64[N]) -> pa.f64:
    s = 0.0
    for i in range(N):
        s += x[i] * x[i]
    return s
