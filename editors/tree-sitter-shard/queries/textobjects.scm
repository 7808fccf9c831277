; Text objects for shard (nvim-treesitter-textobjects, Helix): functions,
; layers and models as classes, parameters and arguments, calls, comments.

(fn_decl body: (block) @function.inside) @function.around

(layer_decl body: (body) @class.inside) @class.around
(model_decl body: (body) @class.inside) @class.around
(train_decl options: (options) @class.inside) @class.around

(fn_param) @parameter.inside
(call_args (_) @parameter.inside)
(named_arg) @parameter.inside
(option) @parameter.inside

(call_expr) @call.around
(call_args) @call.inside

(comment) @comment.around

(let_stmt) @assignment.around
(let_stmt value: (_) @assignment.rhs)
