; Highlights for shard. Editors disagree on whether the first or the last
; matching pattern wins, so the patterns below are written not to overlap.

(comment) @comment
(string) @string
(int) @number
(float) @number.float

; ── keywords ───────────────────────────────────────────────────────────────
["import" "pragma"] @keyword.import
["const" "mesh" "layer" "model" "table" "feature" "train" "let" "init" "on"] @keyword
"fn" @keyword.function
"local" @keyword
"partial" @keyword.modifier

(dtype) @type.builtin
(reduce_op) @keyword.operator

; ── declarations ───────────────────────────────────────────────────────────
(import path: (ident) @module)
(pragma name: (ident) @attribute)
(const_decl name: (ident) @constant)
(mesh_decl name: (ident) @type)
(layer_decl name: (ident) @type)
(model_decl name: (ident) @type)
(table_decl name: (ident) @type)
(feature_decl name: (ident) @variable)
(feature_decl table: (ident) @type)
(train_decl model: (ident) @type)
(train_decl mesh: (ident) @type)
(fn_decl name: (ident) @function)
(fn_param name: (ident) @variable.parameter)
(weight_decl name: (ident) @variable.member)
(sublayer name: (ident) @variable.member)
(directive name: (ident) @function.builtin)
(let_stmt name: (ident) @variable)
(let_names name: (ident) @variable)

; mesh axes and shardings: `mesh pod(dp: 4)`, `f32[B@dp, D@(a, b)]`, `@_`
(axis_def name: (ident) @label)
(dim "@" @label)
(axes (ident) @label)
(replicated) @label
(pending_item axis: (ident) @label)
(local_block axis: (ident) @label)

(key) @property

; ── calls and well-known names ────────────────────────────────────────────
((ident) @constant
  (#match? @constant "^[A-Z][A-Z0-9_]*$"))

; layer instantiation: `LayerNorm(D)`, `Mlp(D -> FF@mp)`
((call_expr function: (ident) @type)
  (#match? @type "^[A-Z]")
  (#not-match? @type "^[A-Z][A-Z0-9_]*$"))

; built-ins, library names and collectives, from the primitives' registry (src/prim)
; registry (generated; SHARDC_BLESS=1 cargo test --test registry rewrites it)
((call_expr function: (ident) @function.builtin)
  (#any-of? @function.builtin
    "relu" "gelu" "silu" "tanh" "exp" "log" "sqrt" "rsqrt" "sigmoid" "square" "abs"
    "sin" "cos" "softplus" "log_sigmoid" "erf" "gelu_exact" "softmax" "log_softmax"
    "layer_norm" "rms_norm" "sum" "mean" "max" "min" "einsum" "reshape" "transpose"
    "split" "cast" "stop_gradient" "stack" "concat" "maximum" "minimum" "clamp" "pow"
    "greater" "greater_equal" "less" "less_equal" "equal" "not_equal" "where" "argmax"
    "argmin" "top_k" "top_k_indices" "cumsum" "var" "take_along_axis" "scatter_add"
    "arange" "broadcast_to" "repeat" "dropout" "one_hot" "embed" "lookup"
    "causal_attention" "attention" "softmax_cross_entropy" "softmax_cross_entropy_rows"
    "add_loss" "observe" "step_total" "repeat" "shard_params" "normal"
    "truncated_normal" "uniform" "constant" "rows" "sgd" "adam" "adamw" "adagrad" "ftrl"
    "lion" "muon" "warmup_cosine" "warmup_linear" "warmup_constant" "inverse_sqrt" "wsd"
    "shakespeare_words" "shakespeare_chars" "text" "tokens" "arrays" "synthetic"
    "clicks"))

; collectives get a colour of their own: each one is communication.
((call_expr function: (ident) @function.macro)
  (#any-of? @function.macro
    "psum" "pmean" "pmax" "pmin" "reduce" "all_gather" "psum_scatter" "all_to_all"
    "ppermute" "axis_index"))

((call_expr function: (ident) @function.call)
  (#not-match? @function.call "^[A-Z]")
  (#not-any-of? @function.call
    "relu" "gelu" "silu" "tanh" "exp" "log" "sqrt" "rsqrt" "sigmoid" "square" "abs"
    "sin" "cos" "softplus" "log_sigmoid" "erf" "gelu_exact" "softmax" "log_softmax"
    "layer_norm" "rms_norm" "sum" "mean" "max" "min" "einsum" "reshape" "transpose"
    "split" "cast" "stop_gradient" "stack" "concat" "maximum" "minimum" "clamp" "pow"
    "greater" "greater_equal" "less" "less_equal" "equal" "not_equal" "where" "argmax"
    "argmin" "top_k" "top_k_indices" "cumsum" "var" "take_along_axis" "scatter_add"
    "arange" "broadcast_to" "repeat" "dropout" "one_hot" "embed" "lookup"
    "causal_attention" "attention" "softmax_cross_entropy" "softmax_cross_entropy_rows"
    "add_loss" "observe" "step_total" "repeat" "shard_params" "normal"
    "truncated_normal" "uniform" "constant" "rows" "sgd" "adam" "adamw" "adagrad" "ftrl"
    "lion" "muon" "warmup_cosine" "warmup_linear" "warmup_constant" "inverse_sqrt" "wsd"
    "shakespeare_words" "shakespeare_chars" "text" "tokens" "arrays" "synthetic"
    "clicks" "psum" "pmean" "pmax" "pmin" "reduce" "all_gather" "psum_scatter"
    "all_to_all" "ppermute" "axis_index"))

; a collective's mesh axes: `psum(x, mp)`, `all_gather(x, mp, dim: 1)`
((call_expr
   function: (ident) @_collective
   arguments: (call_args . (ident) @label))
  (#any-of? @_collective
    "axis_index"))
((call_expr
   function: (ident) @_collective
   arguments: (call_args . (_) (ident) @label))
  (#any-of? @_collective
    "psum" "pmean" "pmax" "pmin" "all_gather" "psum_scatter" "all_to_all" "ppermute"))
; /registry

; bare names with a meaning: `init zeros`, `combiner: sum`, `kind: cuda`
((weight_decl init: (ident) @constant.builtin)
  (#any-of? @constant.builtin "zeros" "ones" "xavier" "lecun"))
; option values: initializers, losses, metrics, optimizers, precisions, pipeline
; schedules, combiners, mesh kinds, from the registry (src/vocab)
; vocabulary (generated; SHARDC_BLESS=1 cargo test --test registry rewrites it)
((option value: (ident) @constant.builtin)
  (#any-of? @constant.builtin
    "zeros" "ones" "xavier" "lecun" "softmax_cross_entropy" "mse"
    "sigmoid_binary_cross_entropy" "accuracy" "auc" "sgd" "adam" "adamw" "adagrad"
    "ftrl" "lion" "muon" "gpipe" "one_f_one_b" "interleaved" "zb_h1" "zbv" "jsonl"
    "tensorboard" "sum" "mean" "sqrtn" "virtual" "cuda" "mpi"))
((option value: (list (dim size: (ident) @constant.builtin)))
  (#any-of? @constant.builtin
    "accuracy" "auc"))
((option value: (ident) @type.builtin)
  (#any-of? @type.builtin
    "f32" "bf16" "f16"))
((named_arg value: (ident) @constant.builtin)
  (#any-of? @constant.builtin
    "gpipe" "one_f_one_b" "interleaved" "zb_h1" "zbv" "sum" "mean" "sqrtn"))
; /vocabulary

; dtypes used as values: `cast(x, bf16)`
((call_args (ident) @type.builtin)
  (#any-of? @type.builtin "f32" "f16" "bf16" "f64" "i32" "i64" "bool"))

; ── operators and punctuation ──────────────────────────────────────────────
(binary_expr operator: _ @operator)
(dim_binary operator: _ @operator)
(unary_expr operator: _ @operator)
["=" "->"] @operator
(ellipsis) @punctuation.special

["(" ")" "[" "]" "{" "}"] @punctuation.bracket
["," ":" ";"] @punctuation.delimiter
