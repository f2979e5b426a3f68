"""``pa.explain`` / ``k.explain()``: the report is read off the real pipeline objects."""

import json

import islpy as isl
import pytest

import polyad as pa
from polyad import ir
from polyad.ad import grad_kernel
from polyad.poly import PolyModel, boundary_access_map
from polyad.report import explain, report
from polyad.pipeline import Options
from polyad.testing import resolve_index

M, N, K = pa.sizes("M N K")


@pa.kernel
def tv_cost(g: pa.f64[M, N].clamped, b: pa.f64[M, N], lam: pa.f64) -> pa.f64:
    C = 0.0
    for m in range(M):
        for n in range(N):
            C += (g[m, n] - b[m, n]) ** 2
            C += lam * abs(g[m, n - 1] - g[m, n])
            C += lam * abs(g[m - 1, n] - g[m, n])
    return C


@pa.kernel
def prod_vec(x: pa.f64[N]) -> pa.f64:
    p = 1.0
    for i in range(N):
        p = p * x[i]
    return p


@pa.kernel
def conv_scatter(x: pa.f64[N], w: pa.f64[K], y: pa.Out(pa.f64[N + K])):
    for i in range(N):
        for j in range(K):
            y[i + j] += x[i] * w[j]


@pa.kernel
def prefix(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(1, N):
        y[i] = y[i - 1] + x[i]


@pa.kernel
def squares(x: pa.f64[N], y: pa.Out(pa.f64[N])):
    for i in range(N):
        t = x[i] * 2.0
        y[i] = t * t


@pa.kernel
def shifted(x: pa.f64[N].circular, y: pa.Out(pa.f64[M, N])):
    tmp = pa.zeros(pa.f64[M, N])
    for m in range(M):
        for i in range(N):
            tmp[m, i] = x[i - 2] + x[i + 1]
    for m in range(M):
        for i in range(N):
            y[m, i] = tmp[m, i]


@pa.kernel
def filter_gradient(x: pa.f64[M, N].clamped, r: pa.f64[M, N], df: pa.Out(pa.f64[K])):
    for k in range(K):
        df[k] = 0.0
    for m in range(M):
        for n in range(N):
            for k in range(K):
                df[k] += x[m, n + k - 2] * r[m, n]


ALL = [tv_cost, prod_vec, conv_scatter, prefix, squares, shifted, filter_gradient]


def test_explain_text_sections_and_method():
    text = pa.explain(tv_cost)
    assert text == tv_cost.explain()
    assert text.startswith(f"kernel tv_cost  ({__file__}:")
    for section in ("signature", "statements, domains and access relations",
                    "dependences (between scheduled statements)", "schedule tree (ISL; ",
                    "AST and loop decisions", "generated source (openmp)"):
        assert f"\n{section}" in text
    assert tv_cost.source.strip() in text                # the very source that is compiled
    assert "  C: void tv_cost(const double *restrict g" in text


@pytest.mark.parametrize("k", ALL, ids=lambda k: k.ir.name)
def test_loop_decisions_are_the_scheduler_s(k):
    """One source of truth: every loop of the report is a plan entry of the compiled artifact
    (the schedule's LoopFacts and the target's decision), named as in the C."""
    d = report(k)
    art = k.artifact(Options())
    assert d["source"] == art.source == k.source
    assert sorted(lp["annotation"] for lp in d["loops"]) == sorted(art.scheduled.loops)
    for lp in d["loops"]:
        plan = art.plan.loops[lp["annotation"]]
        info = plan.facts
        assert info is art.scheduled.loops[lp["annotation"]]
        assert (lp["parallel"], lp["omp_parallel"], lp["simd"], lp["carried"]) == \
               (info.parallel, plan.threads, plan.simd, info.carried)
        assert lp["reductions"] == info.reductions
        assert lp["private"] == sorted(info.private)
        assert lp["atomic"] == sorted(plan.atomic)
        assert lp["statements"] == sorted(info.statements)
        assert lp["iterator"] == plan.iterator
        assert f"int64_t {plan.iterator} = " in d["source"]  # a for loop, or a lane-sum block
        if not info.parallel:
            assert lp["why"] == [info.why_not_parallel] and lp["decision"] == "sequential"
        elif plan.mapping:
            assert lp["why"][-1] == plan.mapping
    source = d["source"]
    assert sum(lp["omp_parallel"] for lp in d["loops"]) == source.count("#pragma omp parallel for")
    assert any(lp["omp_parallel"] and lp["atomic"] for lp in d["loops"]) == \
        ("#pragma omp atomic" in source)


def test_why_not_parallel_and_clauses():
    seq = report(prefix)["loops"]
    assert [(lp["decision"], lp["why"]) for lp in seq] == \
        [("sequential", ["'y' has loop-carried flow dependences"])]
    assert report(prod_vec)["loops"][0]["why"] == \
        ["scalar 'p' carries a value from one iteration to the next"]
    (lp,) = report(squares)["loops"]
    assert lp["decision"].startswith("omp parallel for") and lp["decision"].endswith(" private(t)")
    assert any("scalar 't' is written before it is read in every iteration" in w
               for w in lp["why"])
    (lp,) = [x for x in report(tv_cost)["loops"] if x["iterator"] == "m"]
    assert lp["decision"] == "omp parallel for reduction(+: C)"
    text = explain(conv_scatter)
    assert "scatters into 'y' with '+='" in text


def test_privatized_scatter_reported():
    d = report(filter_gradient)
    (lp,) = [lp for lp in d["loops"] if lp["privatized"] and lp["omp_parallel"]]
    assert lp["privatized"] == {"df": "K"}
    assert "privatized(df[0:K])" in lp["decision"]
    assert any("'df' is a small scatter target (K elements)" in w for w in lp["why"])
    assert "reduction(+:df[0:pa_imax(K, 1)])" in d["source"]


def test_statements_domains_accesses_and_pieces():
    d = report(tv_cost)
    s2 = d["statements"][2]
    assert s2["name"] == "S2" and s2["source"] == "C += lam * abs(g[m, n - 1] - g[m, n])"
    assert s2["line"] == tv_cost.ir.statements[2].line
    assert s2["loops"] == ["for m in range(0, M)", "for n in range(0, N)"]
    assert s2["domain"] == "[M, N] -> { S2[m, n] : 0 <= m < M and 0 <= n < N }"
    (left, center) = s2["reads"]
    assert left["access"] == "g[m, n - 1]" and left["mode"] == "clamped"
    assert left["relation"] == ("[M, N] -> { S2[m, n] -> g[m, -1 + n] : 0 <= m < M and 0 < n < N;"
                                " S2[m, n = 0] -> g[m, 0] : N > 0 and 0 <= m < M }")
    assert [p["name"] for p in s2["pieces"]] == ["S2_0", "S2_1"]
    assert s2["pieces"][1]["ir"] == "C += lam * abs(g[m, 0] - g[m, n])"
    assert s2["scalar_reads"] == ["C"] and s2["scalar_writes"] == ["C"]
    assert d["statements"][0]["pieces"][0]["name"] == "S0"


def test_dependences_by_kind():
    deps = report(prefix)["dependences"]
    flow = [r for r in deps if r["kind"] == "flow"]
    assert flow == [{"kind": "flow", "variable": "y", "source": "S0", "sink": "S0",
                     "relation": "[N] -> { S0[i] -> S0[i' = 1 + i] : 0 < i <= -2 + N }"}]


def test_schedule_tree_and_ast():
    d = report(tv_cost)
    tree = d["schedule_tree"]
    assert tree["type"] == "domain" and "S2_1[m, n = 0]" in tree["domain"]
    band = tree["children"][0]
    assert band["type"] == "band" and len(band["members"]) == 5
    assert band["members"][1]["schedule"]["S1"] == "m"
    assert d["schedule_origin"]
    assert d["ast"][0] == "S0()"
    assert any(line.strip().startswith("for (m = 1; m < M; m += 1)") for line in d["ast"])


def test_derived_kernel_report_has_tapes_and_gathers():
    g = pa.Kernel(ir_kernel=grad_kernel(prod_vec.ir, "x"))
    d = report(g)
    assert d["kernel"] == "prod_vec_grad_x"
    (tape,) = [t for t in d["temporaries"] if t["tape"]]
    assert tape == {"name": tape["name"], "type": "f64[N]", "zero_filled": False, "role": "tape",
                    "tape": True, "elements": "N", "bytes": "8 * N"}
    (taped,) = [t for t in g.ir.temps if t.name == tape["name"]]
    assert taped.holds == "p read by: p = p * x[i] (line 34)"
    assert "tape, uninitialised: N elements = 8 * N bytes" in explain(g)
    dg = report(pa.Kernel(ir_kernel=grad_kernel(tv_cost.ir, "g")))
    decisions = {n: why for st in dg["statements"] for n, why in st["scatter_to_gather"].items()}
    assert "gather" in decisions.values()
    assert all(v == "gather" or v.startswith("scatter: ") for v in decisions.values())


def test_temporaries_and_requirements():
    d = report(shifted)
    assert d["temporaries"] == [{"name": "tmp", "type": "f64[M, N]", "zero_filled": True,
                                 "role": "user", "tape": False, "elements": "M * N", "bytes": "8 * M * N"}]
    assert d["requirements"] and "circular access" in d["requirements"][0]
    assert "checked at call time: the circular access" in explain(shifted)


def test_json_is_the_report_and_dot_is_the_dependence_graph():
    d = json.loads(explain(tv_cost, format="json"))
    assert d == json.loads(json.dumps(report(tv_cost)))
    dot = explain(prefix, format="dot")
    assert dot.startswith('digraph "prefix" {')
    assert '"S0" -> "S0" [label="flow y", style=solid];' in dot
    assert dot.count("{") == dot.count("}")


def test_report_reads_the_artifact_and_reruns_no_stage(monkeypatch):
    import polyad.pipeline
    k = pa.Kernel(ir_kernel=tv_cost.ir)
    art = k.artifact(Options())

    def stage_ran_again(*args, **kwargs):
        raise AssertionError("a pipeline stage ran again")

    monkeypatch.setattr(polyad.pipeline, "schedule_kernel", stage_ran_again)
    monkeypatch.setattr(type(art.target), "plan", stage_ran_again)
    monkeypatch.setattr(type(art.target), "emit", stage_ran_again)
    d = report(k)
    assert d["source"] == art.source
    assert sorted(lp["annotation"] for lp in d["loops"]) == sorted(art.plan.loops)


def test_deterministic_option_is_explained():
    d = report(tv_cost, deterministic=True)
    assert d["deterministic"] is True
    assert all(not lp["omp_parallel"] for lp in d["loops"] if lp["reductions"])
    assert any("deterministic=True" in w for lp in d["loops"] for w in lp["why"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown format 'html'"):
        pa.explain(tv_cost, format="html")
    with pytest.raises(ValueError, match="unknown target 'opencl'"):
        pa.explain(tv_cost, target="opencl")
    with pytest.raises(TypeError, match="expected a polyad kernel, got function"):
        pa.explain(lambda: 0)


@pytest.mark.parametrize("mode", ir.BOUNDARY_MODES)
def test_boundary_access_map_matches_the_mode(mode):
    """The piecewise map of x[i + s] sends every iteration where the mode says (N = 5)."""
    @pa.kernel
    def stencil(x: pa.f64[N], y: pa.Out(pa.f64[N])):
        for i in range(N):
            y[i] = x[i - 2] + x[i + 1]

    k = stencil.ir
    k = ir.Kernel(**{**k.__dict__, "params": (
        ir.Param("x", ir.ArrayType(ir.f64, k.params[0].type.shape, mode)), k.params[1])})
    model = PolyModel(k)
    st = k.statements[0]
    loads = [ld for ld in st.reads()]
    n = 5
    for ld, shift in zip(loads, (-2, 1)):
        rel = boundary_access_map(model, st, ld)
        fixed = rel.fix_val(isl.dim_type.param, 0, n)
        got = {}
        fixed.wrap().foreach_point(lambda p: got.setdefault(
            p.get_coordinate_val(isl.dim_type.set, 0).to_python(), []).append(
            p.get_coordinate_val(isl.dim_type.set, 1).to_python()))
        for i in range(n):
            want = resolve_index(i + shift, n, mode)
            assert got.get(i, [None]) == [want], (mode, shift, i, got)
