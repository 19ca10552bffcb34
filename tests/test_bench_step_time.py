"""benchmarks/step_time.py: its tables, the fit of the achieved fractions,
the explanations `--tried` refits with, its published rows and the BERT
graphs it builds for them."""

import dataclasses

import pytest

from benchmarks import step_time

# Tables and fits over recorded numbers (and BERT graphs built with
# tf.compat.v1 ops): the same on both stacks, so run once (tools/run_tests.sh).
pytestmark = pytest.mark.one_stack


def test_step_time_tables_show_the_ratios():
    row = step_time.Published("bert-pretraining", 128, "A100-SXM4-40GB",
                              "TF32", 64, 238.1, "tf-bert", "held out")
    text = step_time.throughput_table([
        {"row": row, "predicted": 300.0, "ratio": 300.0 / 238.1,
         "products": "tf32"},
        {"row": dataclasses.replace(row, role="fit"), "predicted": 250.0,
         "ratio": 250.0 / 238.1, "products": "tf32"}])
    assert text.splitlines()[2:] == [
        "| BERT-large pretraining, seq 128 | A100-SXM4-40GB | TF32 (tf32) | "
        "64 | 238 seq/s | 300 seq/s | 1.26 (off by 26%) | held out | [3] |",
        "| BERT-large pretraining, seq 128 | A100-SXM4-40GB | TF32 (tf32) | "
        "64 | 238 seq/s | 250 seq/s | 1.05 | fitted | [3] |"]
    # ResNet50 rows say the layout of their convolutions.
    rn50 = step_time.Published("resnet50", None, "A100-SXM4-80GB", "AMP",
                               1280, 1582.0, "lambda", "held out", "NCHW")
    assert step_time.throughput_table([
        {"row": rn50, "predicted": 2000.0, "ratio": 2000.0 / 1582.0,
         "products": "fp16"}]).splitlines()[2] == (
        "| ResNet50 (PyTorch, Lambda) | A100-SXM4-80GB | AMP (fp16; NCHW) | "
        "1280 | 1582 img/s | 2000 img/s | 1.26 (off by 26%) | held out | "
        "[4] |")
    # A case no plan fits is a row that says why.
    assert step_time.lms_table([{
        "image": 6592, "batch": 1, "error": "AutotuneError: too big"}]
    ).splitlines()[2] == (
        "| 6592x6592, batch 1 | - | no plan: AutotuneError: too big "
        "| | | | | |")


def test_step_time_fit_finds_the_fractions_that_made_the_rows():
    """Rows whose 'published' throughput is the model's own prediction with
    known fractions: the fit finds those fractions again (to its grid's
    resolution), each from the rows that depend on it."""
    from tflms import analysis, steptime
    from tflms import graph_index as gi
    mb = 1 << 20

    def graph(product, relu_mb):
        # A product (compute-bound at these sizes) and a memory-bound op;
        # two sizes of the latter make memory's share differ between rows.
        return gi.from_edges(
            [("x", "Placeholder", {"outputs": [64 * mb]}),
             ("p", product, {"outputs": [64 * mb], "flops": 4 * 10 ** 10}),
             ("r", "Relu", {"outputs": [relu_mb * mb]}),
             ("n", "MatMul", {"outputs": [4]})],
            edges=[("x", "p"), ("p", "r"), ("r", "n")])

    truth = steptime.Efficiency(memory=0.8, fp32=0.7, tf32=0.6,
                                conv_fp32=0.5, conv_tf32=0.3)
    rows, costs = [], []
    for product, relu_mb in (("MatMul", 4096), ("MatMul", 256),
                             ("Conv2D", 4096), ("Conv2D", 256)):
        index = graph(product, relu_mb)
        roles = analysis.classify_ops(index)
        for gpu, precision in (("V100-SXM2-16GB", "FP32"),
                               ("A100-SXM4-40GB", "TF32")):
            step = steptime.StepTimeModel(
                index, roles, 1, gpu=gpu,
                kernels=steptime.KernelOptions(efficiency=truth)).predict()
            rows.append(step_time.Published(
                "bert-pretraining" if product == "MatMul" else "resnet50",
                None, gpu, precision, 1, 1 / step.without_lms_s, "tf-bert",
                "fit"))
            costs.append(step_time._Costs(
                index, roles, 1))
    fitted = step_time.fit(rows, costs)
    for name in ("memory", "fp32", "tf32", "conv_fp32", "conv_tf32"):
        assert getattr(fitted, name) == pytest.approx(
            getattr(truth, name), rel=0.025), name
    # Nothing was fitted for float16: it stays at the peak, and bfloat16
    # takes float16's fractions.
    assert fitted.fp16 == fitted.bf16 == 1.0
    assert step_time.efficiency_text(fitted)[1] is (
        fitted == steptime.ACHIEVED)


def test_step_time_tried_explanations_change_what_they_name():
    """Each explanation `--tried` refits with changes the costs it names
    and nothing else: on a convolution, a batch norm and a product, the
    step moves by what the explanation adds or takes away, on the rows it
    applies to."""
    from tflms import analysis, hardware, steptime
    from tflms import graph_index as gi
    activation = ((8, 64, 64, 64), 4)  # 8 MiB of float32
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [activation]}),
         ("c", "Conv2D", {"outputs": [activation], "flops": 4 * 10 ** 10}),
         ("b", "FusedBatchNormV3", {"outputs": [activation]}),
         ("n", "MatMul", {"outputs": [4], "flops": 10 ** 9})],
        edges=[("x", "c"), ("c", "b"), ("b", "n")])
    roles = analysis.classify_ops(index)
    a100_gpu = "A100-SXM4-40GB"
    costs = step_time._Costs(
        index, roles, 1, gpu=a100_gpu)
    eight_mib = float(8 << 20)
    assert costs.read_again.sum() == eight_mib  # the batch norm's input
    efficiency = steptime.ACHIEVED

    def row(gpu, precision, source="tf-rn50", layout="NHWC", fusion=True):
        return step_time.Published("resnet50", None, gpu, precision, 1, 1.0,
                                   source, "fit", layout, fusion=fusion)

    def same_fusion():
        raise AssertionError("only rows timed without fusion are refused")

    def step(name, published, of=costs, refused=same_fusion):
        gpu = hardware.GPUS[published.gpu]
        varied = step_time._tried(
            name, published, of, refused)
        return varied.time(gpu, step_time._products(
            published, gpu), efficiency)

    a100 = row(a100_gpu, "TF32")
    bandwidth = hardware.GPUS[a100_gpu].memory_bandwidth * efficiency.memory
    base = step("as published", a100)
    assert base == costs.time(hardware.GPUS[a100_gpu], "tf32", efficiency)
    # The batch norm is memory-bound: its input read again is all it adds.
    assert step("batch norm twice", a100) == pytest.approx(
        base + eight_mib / bandwidth)
    # In NCHW a TF32 convolution pays two transposes, each reading and
    # writing its tensor in a kernel of its own; the explanation takes
    # them away, and only from TF32 rows in NCHW.
    nchw = step_time._Costs(
        index, roles, 1, layout="NCHW", gpu=a100_gpu)
    # The convolution's input and output, each 4-D, each read and written.
    assert (nchw.transposed, nchw.transpose_launches) == (
        2 * 2 * eight_mib, 2)
    a100_nchw = row(a100_gpu, "TF32", layout="NCHW")
    assert step("as published", a100_nchw, nchw) == pytest.approx(
        base + 2 * 2 * eight_mib / bandwidth + 2 * costs.launch_s)
    assert step("TF32 without transposes", a100_nchw, nchw) == \
        pytest.approx(base)
    assert step("TF32 without transposes", a100) == base
    # Transposes at half the bandwidth: each costs twice its time.
    assert step("transposes at half bandwidth", a100_nchw, nchw) == \
        pytest.approx(base + 2 * 2 * 2 * eight_mib / bandwidth
                      + 2 * costs.launch_s)
    assert step("transposes at half bandwidth", a100) == base
    # The batch norm read again on PyTorch's rows in NCHW only.
    pytorch_nchw = row(a100_gpu, "TF32", source="pt-rn50", layout="NCHW",
                       fusion=False)
    assert step("batch norm twice in PyTorch NCHW", pytorch_nchw, nchw) == \
        pytest.approx(step("as published", pytorch_nchw, nchw)
                      + eight_mib / bandwidth)
    assert step("batch norm twice in PyTorch NCHW", a100_nchw, nchw) == \
        step("as published", a100_nchw, nchw)
    assert step("batch norm twice in PyTorch NCHW",
                row(a100_gpu, "AMP", source="pt-rn50", fusion=False)) == base
    # A V100 runs float32 convolutions on its CUDA cores: nothing to
    # transpose, in either layout.
    v100 = step_time._Costs(
        index, roles, 1, layout="NCHW", gpu="V100-SXM2-16GB")
    assert (v100.transposed, v100.transpose_launches) == (0, 0)
    # Added times exceed the larger; the 2-norm lies between.
    assert base < step("p-norm 2", a100) < step("added", a100)
    # Tensor cores at the A100's rate per SM and clock: slower on an
    # H100, the same on an A100.
    h100 = row("H100-PCIe-80GB", "TF32", source="lambda", fusion=False)
    assert step("H100 at A100 rate", h100) > step("as published", h100)
    assert step("H100 at A100 rate", a100) == base
    # The rows timed without fusion are the ones timed with it instead.
    calls = []

    def fused():
        calls.append(1)
        return nchw
    assert step("PyTorch fused", h100, refused=fused) == step(
        "as published", h100, nchw)
    assert calls == [1]
    assert step("PyTorch fused", a100) == base
    # Only Lambda's PyTorch BERT rows are the ones "PyTorch BERT unfused"
    # times with the other setting.
    bert = step_time.Published("bert-squad", 384, "A100-SXM4-80GB", "TF32",
                               1, 1.0, "lambda", "held out")
    assert step("PyTorch BERT unfused", bert, refused=fused) == step(
        "as published", bert, nchw)
    assert calls == [1, 1]
    assert step("PyTorch BERT unfused", h100) == step("as published", h100)
    assert step("PyTorch BERT unfused", a100) == base
    with pytest.raises(ValueError, match="no tried explanation 'XLA'"):
        step("XLA", a100)


def test_step_time_rows_state_their_runs_layout_and_fusion():
    """The published rows say how their runs laid out convolutions and
    fused ops: PyTorch's ResNet50 without fusion (no torch.jit), every
    other run fused; TensorFlow's XLA in NCHW for float32 convolutions
    and in NHWC for float16 ones."""
    rows = step_time.PUBLISHED
    pytorch_resnet = [r for r in rows if r.model == "resnet50"
                      and r.source in ("pt-rn50", "pt-rn50-2006",
                                       "lambda")]
    assert len(pytorch_resnet) == 12
    assert [r for r in rows if not r.fusion] == pytorch_resnet
    assert sorted((r.precision, r.layout) for r in rows
                  if r.source == "tf-rn50") == [
        ("AMP", "NHWC"), ("AMP", "NHWC"), ("FP32", "NCHW"), ("TF32", "NCHW")]


def test_step_time_section_is_replaced_or_appended():
    section = "%s\nnew\n%s" % (step_time.BEGIN, step_time.END)
    assert step_time.section_of("# Doc\n") is None
    appended = step_time.with_section("# Doc\n\n", section)
    assert appended == "# Doc\n\n" + section + "\n"
    assert step_time.section_of(appended) == section
    old = "# Doc\n\n%s\nold\n%s\n\nafter\n" % (step_time.BEGIN, step_time.END)
    assert step_time.with_section(old, section) == (
        "# Doc\n\n" + section + "\n\nafter\n")


def test_bert_softmax_runs_in_the_precision_of_the_published_run():
    """Automatic mixed precision keeps BERT's softmax in float32; apex's O2
    (Lambda's BERT runs) casts the model to float16, softmax included:
    step_time builds those rows' graphs so, and only those."""
    import tensorflow as tf
    from benchmarks import models

    def softmax_dtypes(precision):
        built = models.bert(layers=2, hidden=16, heads=2, seq=8, batch=2,
                            vocab=50, predictions=2, precision=precision,
                            head="squad", optimizer="adam")
        return [op.outputs[0].dtype for op in built.graph.get_operations()
                if op.type == "Softmax"]

    assert softmax_dtypes("float16") == [tf.float16] * 2
    assert softmax_dtypes("mixed_float16") == [tf.float32] * 2
    assert softmax_dtypes("float32") == [tf.float32] * 2
    o2 = [(r.gpu, r.batch) for r in step_time.PUBLISHED
          if r.amp_graph == "float16"]
    assert o2 == [("A100-SXM4-80GB", 112), ("H100-PCIe-80GB", 112)]
    assert all(r.source == "lambda" and r.model == "bert-squad"
               and r.precision == "AMP" for r in step_time.PUBLISHED
               if r.amp_graph == "float16")
    with pytest.raises(ValueError, match="precision must be one of "
                       "float32, mixed_float16, float16; got 'half'"):
        models.bert(precision="half")
