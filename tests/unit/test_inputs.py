"""Input generators: deterministic per seed, in range, valid CSR, exact dtypes."""

import numpy as np
import pytest

from kernel_lsp.core import inputs as inputs_module
from kernel_lsp.core.inputs import InputError, bf16_to_float32, float32_to_bf16, make_inputs, scalar_args
from kernel_lsp.core.spec import parse_spec


def spec_with(arrays, scalars=(("n", "int32", 1000),)):
    params = [{"name": n, "scalar": t, "value": v} for n, t, v in scalars]
    params += [{"name": name, "array": t, "size": size, "init": init, "role": "in"} for name, t, size, init in arrays]
    return parse_spec({"kernel": "k", "params": params, "grid": [1, 1, 1], "block": [32, 1, 1]})


def test_same_seed_same_inputs_other_seed_other_inputs():
    spec = spec_with([("x", "float32", "n", "uniform(-1,1)"), ("i", "int32", "n", "randint(0,9)")])
    a, b, c = make_inputs(spec, 7), make_inputs(spec, 7), make_inputs(spec, 8)
    assert np.array_equal(a["x"], b["x"]) and np.array_equal(a["i"], b["i"])
    assert not np.array_equal(a["x"], c["x"])


def test_an_array_does_not_depend_on_the_size_of_earlier_ones():
    small = spec_with([("a", "float32", "10", "uniform(0,1)"), ("x", "float32", "n", "uniform(0,1)")])
    large = spec_with([("a", "float32", "500", "uniform(0,1)"), ("x", "float32", "n", "uniform(0,1)")])
    assert np.array_equal(make_inputs(small, 3)["x"], make_inputs(large, 3)["x"])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_uniform_and_normal_ranges_and_dtypes(dtype):
    spec = spec_with([("u", dtype, "n", "uniform(-2,3)"), ("g", dtype, "n", "normal(5, 0.5)")], scalars=(("n", "int32", 20000),))
    arrays = make_inputs(spec, 1)
    expected = np.uint16 if dtype == "bfloat16" else np.dtype(dtype).type
    assert arrays["u"].dtype == expected and arrays["u"].size == 20000
    u = bf16_to_float32(arrays["u"]) if dtype == "bfloat16" else arrays["u"].astype(np.float64)
    g = bf16_to_float32(arrays["g"]) if dtype == "bfloat16" else arrays["g"].astype(np.float64)
    assert u.min() >= -2 and u.max() <= 3 and u.std() > 1
    assert abs(float(g.mean()) - 5) < 0.05 and abs(float(g.std()) - 0.5) < 0.05


def test_integer_initializers():
    spec = spec_with(
        [
            ("r", "int8", "n", "randint(-5,5)"),
            ("p", "int32", "n", "perm(n)"),
            ("a", "int64", "n", "arange"),
            ("f", "uint32", "n", "fill(7)"),
            ("l", "int32", "n", "list(1,-2,3)"),
            ("z", "uint8", "n", "zeros"),
            ("o", "float32", "n", "ones"),
        ]
    )
    x = make_inputs(spec, 2)
    assert x["r"].dtype == np.int8 and x["r"].min() == -5 and x["r"].max() == 5  # inclusive at both ends
    assert sorted(x["p"].tolist()) == list(range(1000)) and not np.array_equal(x["p"], np.arange(1000))
    assert np.array_equal(x["a"], np.arange(1000))
    assert x["f"].dtype == np.uint32 and set(x["f"].tolist()) == {7}
    assert x["l"][:7].tolist() == [1, -2, 3, 1, -2, 3, 1]
    assert not x["z"].any() and (x["o"] == 1).all()


def test_csr_is_valid():
    spec = spec_with(
        [("rowptr", "int32", "rows+1", "csr_rowptr(rows,k)"), ("col", "int32", "rows*k", "csr_colidx(rows,cols,k)")],
        scalars=(("rows", "int32", 300), ("cols", "int32", 50), ("k", "int32", 7)),
    )
    x = make_inputs(spec, 4)
    rowptr, col = x["rowptr"], x["col"]
    assert rowptr[0] == 0 and rowptr[-1] == col.size == 2100
    assert (np.diff(rowptr) == 7).all()
    rows = col.reshape(300, 7)
    assert (np.diff(rows, axis=1) > 0).all()  # sorted and distinct in every row
    assert rows.min() >= 0 and rows.max() < 50
    assert len({tuple(r) for r in rows.tolist()}) > 250  # rows are drawn independently


def test_csr_with_k_equal_cols_takes_every_column():
    spec = spec_with([("col", "int32", "rows*k", "csr_colidx(rows,k,k)")], scalars=(("rows", "int32", 3), ("k", "int32", 4)))
    assert make_inputs(spec, 0)["col"].tolist() == [0, 1, 2, 3] * 3


def test_file_arrays_are_checked():
    spec = spec_with([("w", "float32", "n", "file(w.npy)")])
    good = np.arange(1000, dtype=np.float32)
    assert np.array_equal(make_inputs(spec, 0, files={"w.npy": good})["w"], good)
    with pytest.raises(InputError, match="holds float64"):
        make_inputs(spec, 0, files={"w.npy": good.astype(np.float64)})
    with pytest.raises(InputError, match="holds 10 elements"):
        make_inputs(spec, 0, files={"w.npy": good[:10]})
    with pytest.raises(InputError, match="was not loaded"):
        make_inputs(spec, 0)


def test_variants_change_sizes():
    spec = parse_spec({
        "kernel": "k",
        "params": [{"name": "n", "scalar": "int32", "value": 100}, {"name": "x", "array": "float32", "size": "2*n", "init": "uniform(0,1)", "role": "in"}],
        "grid": [1, 1, 1], "block": [1, 1, 1], "variants": [{"n": 7}],
    })
    assert make_inputs(spec, 0)["x"].size == 200
    assert make_inputs(spec, 0, variant=0)["x"].size == 14


def test_bfloat16_round_trip_and_rounding():
    values = np.array([1.0, -2.5, 3.0e38, 1.0 + 2**-9, 0.0], dtype=np.float32)
    bits = float32_to_bf16(values)
    back = bf16_to_float32(bits)
    assert back[0] == 1.0 and back[1] == -2.5 and back[4] == 0.0
    assert back[3] == 1.0  # 1 + 2^-9 is below bfloat16's half-ulp (2^-8): rounds to 1
    assert bits.dtype == np.uint16 and bits[0] == 0x3F80


def test_scalar_args_have_the_declared_width():
    spec = spec_with([], scalars=(("n", "int32", 5), ("m", "uint64", 2**40), ("a", "float32", 1.5), ("b", "float64", 2.0)))
    s = scalar_args(spec)
    assert type(s["n"]) is np.int32 and type(s["m"]) is np.uint64 and type(s["a"]) is np.float32 and type(s["b"]) is np.float64
    assert s["m"] == 2**40


@pytest.mark.parametrize("dtype, init", [("float32", "uniform(-2,3)"), ("float64", "uniform(-2,3)"), ("float32", "normal(5, 0.5)"), ("float16", "normal(5, 0.5)")])
def test_chunked_draws_equal_one_whole_array_draw(monkeypatch, dtype, init):
    # Inputs are drawn a chunk at a time; the values must be those of a single draw (reproducibility across versions).
    monkeypatch.setattr(inputs_module, "_DRAW_CHUNK", 1000)
    spec = spec_with([("x", dtype, "n", init)], scalars=(("n", "int32", 4321),))
    child = np.random.SeedSequence(9).spawn(1)[0]
    rng = np.random.default_rng(child)
    draw_dtype = np.float64 if dtype == "float64" else np.float32
    if init.startswith("uniform"):
        expected = rng.random(4321, dtype=draw_dtype)
        expected *= 5.0
        expected += -2.0
    else:
        expected = rng.standard_normal(4321, dtype=draw_dtype)
        expected *= 0.5
        expected += 5.0
    got = make_inputs(spec, 9)["x"]
    assert np.array_equal(got.view(np.uint8), expected.astype(dtype).view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "uint64"])
def test_zeros_are_made_in_the_array_type(dtype):
    x = make_inputs(spec_with([("x", dtype, "n", "zeros")]), 0)["x"]
    assert x.dtype == inputs_module.NUMPY_DTYPES[dtype] and x.size == 1000 and not x.view(np.uint8).any()


# --- counter-based inputs drawn on the device ----------------------------------------------------

from kernel_lsp.core.inputs import DevicePlan, counter_values, device_plan, draw_arrays  # noqa: E402


def _draw_spec(init, array_type="float32", n=10000):
    return parse_spec({
        "kernel": "k", "params": [
            {"name": "n", "scalar": "int32", "value": n},
            {"name": "x", "array": array_type, "size": "n", "init": init, "role": "in"},
            {"name": "y", "array": "float32", "size": "n", "role": "out"},
        ], "grid": [1, 1, 1], "block": [32, 1, 1],
    })


def test_device_draws_follow_the_initializer():
    plan = draw_arrays(_draw_spec("uniform(-3,5)"), 1, None)["x"]
    assert isinstance(plan, DevicePlan) and plan.kernel == "klsp_gen_f32" and (plan.a, plan.b) == (8.0, -3.0)
    values = counter_values(plan, "float32")
    assert values.dtype == np.float32 and -3 <= values.min() < -2.9 and 4.9 < values.max() < 5
    ints = counter_values(draw_arrays(_draw_spec("randint(-2,3)", "int32"), 1, None)["x"], "int32")
    assert set(np.unique(ints)) == {-2, -1, 0, 1, 2, 3}
    normal = counter_values(draw_arrays(_draw_spec("normal(1,2)", "float64"), 1, None)["x"], "float64")
    assert abs(normal.mean() - 1) < 0.1 and abs(normal.std() - 2) < 0.1
    assert (counter_values(draw_arrays(_draw_spec("fill(7)", "int8"), 1, None)["x"], "int8") == 7).all()
    assert np.array_equal(counter_values(draw_arrays(_draw_spec("arange", "float16"), 1, None)["x"], "float16")[:4], [0, 1, 2, 3])


def test_device_draws_differ_by_seed_and_array_and_repeat_for_a_seed():
    spec = _draw_spec("uniform(0,1)")
    a, b = draw_arrays(spec, 1, None)["x"], draw_arrays(spec, 2, None)["x"]
    assert a.key != b.key and not np.array_equal(counter_values(a, "float32"), counter_values(b, "float32"))
    assert np.array_equal(counter_values(a, "float32"), counter_values(draw_arrays(spec, 1, None)["x"], "float32"))
    # Element i depends on the key and i only: a longer array starts with the shorter one's values.
    longer = DevicePlan(a.kernel, a.size * 2, a.key, a.kind, a.a, a.b)
    assert np.array_equal(counter_values(longer, "float32")[: a.size], counter_values(a, "float32"))


def test_structured_initializers_stay_on_the_host():
    drawn = draw_arrays(_draw_spec("perm(n)", "int32", n=100), 1, None)
    assert isinstance(drawn["x"], np.ndarray) and sorted(drawn["x"]) == list(range(100))
    assert "y" not in drawn  # out arrays start as poison, not as drawn values
    spec = _draw_spec("uniform(0,1)")
    assert device_plan(spec.arrays[0], 5, {"n": 5}, 1, 0).size == 5
