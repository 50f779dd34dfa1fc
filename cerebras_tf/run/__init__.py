"""The host side of a run on the simulated CS system: what happens after the compiler, around the wse/ executor.

CerebrasEstimator.train/evaluate/predict(use_cs=True) hand the compiled program here
(estimator -> precheck -> rules -> compiler -> run -> wse). One module per part:

- chief:           train_on_system / evaluate_on_system / predict_on_system: the executor loop, checkpoints
                   (CheckpointWriter), summaries, host_call and eval_metric_ops on the host
- host_checks:     the model's tf.Assert and tf.print after each step (TF's errors and output)
- tensor_text:     TF's text for tensors (tf.print's StringFormat, tf.Assert's message)
- divergence:      a diverged run (NaN loss, overflows at the minimum loss scale) stops as NanTensorHook stops it
- tensorboard:     event files written directly (scalars, images, the graph)
- host_kernels_tf: TF's CPU kernels as the executor's dense host kernels; the choice of provider for a run
- trainer_lock:    one training run per model_dir (a lock file; a dead holder's is taken over)

Nothing below (compiler/, wse/, input_workers/, rules/, ir/, amp/) imports it. What the compiler shares
with it stays at the top: write_failures (model_dir's and compile_dir's writes), settings, errors.
"""
