"""The TF-free passes over a whole program, on hand-built programs."""
from __future__ import annotations

import re

from cerebras_tf import ir
from cerebras_tf.ir import passes


def test_prune_keeps_writes_seeds_and_what_outputs_need_and_renumbers(program):
    unused = ir.Kernel(8, "neg", [2], [8], {}, tf_name="gradients/dense/MatMul_grad/MatMul_1")
    program.kernels.insert(3, unused)  # the gradient w.r.t. the features: nobody reads it
    program.kernels[7].outputs = [9]
    program.tensors.append(ir.Tensor(9, [], "float32", "unused_summary"))
    for index, kernel in enumerate(program.kernels):
        kernel.id = index
    alive = passes.prune_dead_kernels(program.kernels, keep={3})
    assert [k.kind for k in alive] == ["read_variable", "matmul", "mean", "gradient_seed", "mul",
                                       "apply_gradient_descent", "assign_add_variable"]
    assert [k.id for k in alive] == list(range(7))


def test_prune_keeps_the_producer_of_a_guard(program):
    program.tensors.append(ir.Tensor(9, [], "bool", "finite"))
    program.kernels.insert(5, ir.Kernel(5, "is_finite", [3], [9], {}, role="optimizer"))
    program.kernels[6].guard = 9
    for index, kernel in enumerate(program.kernels):
        kernel.id = index
    alive = passes.prune_dead_kernels(program.kernels, keep={3})
    assert "is_finite" in [k.kind for k in alive]


def test_gradients_are_the_float_backward_results_read_outside_the_backward_pass(program):
    assert passes.gradient_tensors(program) == [5]
    program.tensors[5].dtype = "int32"  # e.g. the indices of an embedding's gradient
    assert passes.gradient_tensors(program) == []


def test_guarded_trainable_writes_mean_the_model_scales_its_own_loss(program):
    assert not passes.guards_trainable_writes(program)
    program.kernels[5].guard = 0
    assert passes.guards_trainable_writes(program)


def test_phases_split_where_loss_scaling_acts(program):
    forward, optimizer, step = passes.phases(program)
    assert [k.id for k in forward] == [0, 1, 2, 3, 4, 7]
    assert [k.id for k in optimizer] == [5] and [k.id for k in step] == [6]


def test_layers_follow_the_variable_scopes_and_take_in_their_neighbours(program):
    layers = passes.layers(program)
    assert [layer.name for layer in layers] == ["dense"]
    assert layers[0].kernels == list(range(8)) and layers[0].variables == ["dense/w", "global_step"]
    assert {k.layer for k in program.kernels} == {"dense"}


def test_a_program_without_trainable_variables_is_one_layer(program):
    program.variables[0].trainable, program.variables[0].role = False, "state"
    assert [layer.name for layer in passes.layers(program)] == ["program"]


def _scope_layer_by_scanning(kernel: ir.Kernel, scopes: set[str], slot_owner: dict[str, str]) -> str | None:
    """The layer rule as first written (every scope tested, longest first): what the lookup must agree with."""
    ordered = sorted(scopes, key=len, reverse=True)
    for name in kernel.vars:
        owner = slot_owner.get(name, name)
        for scope in ordered:
            if owner == scope or owner.startswith(scope + "/"):
                return scope
    name = passes.GRADIENT_SCOPE.sub(r"\1", kernel.tf_name)
    name = re.sub(r"(^|/)update_", r"\1", name)
    return next((scope for scope in ordered if name.startswith(scope + "/")), None)


def test_the_scope_of_a_kernel_is_the_longest_enclosing_variable_scope():
    scopes = {"dense", "dense_1", "encoder/layer_0", "encoder/layer_0/attention", "encoder", "w"}
    slot_owner = {"encoder/layer_0/attention/q/Adam": "encoder/layer_0/attention/q"}
    cases = [  # (vars, tf_name)
        (["dense/kernel"], "x"), (["dense_1/kernel"], "x"), (["dense_10/kernel"], "dense_1/x"),
        (["encoder/layer_0/attention/q/Adam"], "x"), (["encoder/layer_0/ffn/w"], "x"), (["w"], "x"),
        (["global_step"], "encoder/layer_0/attention/MatMul"), ([], "encoder/layer_0/attention"),
        ([], "gradients/encoder/layer_0/attention/MatMul_grad/MatMul"), ([], "encoder/gradients_3/dense/x_grad/y"),
        ([], "Adam/update_dense_1/kernel/ResourceApplyAdam"), ([], "dense_1"), ([], "dense_12/MatMul"),
        ([], "loss/Mean"), ([], "encoder/layer_1/MatMul"), ([], "w/x"), ([], ""), ([], "/dense/x"),
    ]
    for vars_, tf_name in cases:
        kernel = ir.Kernel(0, "neg", [], [], {}, vars=vars_, tf_name=tf_name)
        assert passes._scope_layer(kernel, scopes, slot_owner) == \
            _scope_layer_by_scanning(kernel, scopes, slot_owner), (vars_, tf_name)
