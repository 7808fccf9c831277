; Scopes and definitions for shard (nvim-treesitter's locals, Helix's and
; Zed's): a file, a layer or model body, a function and a `{ ... }` block each
; open a scope; constants, meshes, layers, weights, sublayers, parameters and
; lets define names; every other identifier is a reference.

(file) @local.scope
(body) @local.scope
(fn_decl) @local.scope
(block) @local.scope

(const_decl name: (ident) @local.definition.constant)
(mesh_decl name: (ident) @local.definition.type)
(layer_decl name: (ident) @local.definition.type)
(model_decl name: (ident) @local.definition.type)
(table_decl name: (ident) @local.definition.type)
(feature_decl name: (ident) @local.definition.var)
(fn_decl name: (ident) @local.definition.function)
(fn_param name: (ident) @local.definition.parameter)
(weight_decl name: (ident) @local.definition.field)
(sublayer name: (ident) @local.definition.field)
(let_stmt name: (ident) @local.definition.var)
(let_names name: (ident) @local.definition.var)
(param_list (ident) @local.definition.parameter)

(ident) @local.reference
