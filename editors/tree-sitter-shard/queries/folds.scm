; Folds for shard: declarations with a body, function blocks, option blocks
; and long calls or lists.

[
  (layer_decl)
  (model_decl)
  (train_decl)
  (table_decl)
  (fn_decl)
  (block)
  (options)
  (local_block)
  (call_args)
  (list)
] @fold
