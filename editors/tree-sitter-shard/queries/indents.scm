; Indentation for shard (nvim-treesitter / Helix captures): the contents of
; bodies, blocks, option blocks, calls and lists are indented one level; the
; closing brace, parenthesis or bracket goes back.

[
  (body)
  (block)
  (options)
  (call_args)
  (list)
  (fn_params)
] @indent.begin

[
  "}"
  ")"
  "]"
] @indent.branch @indent.end

(comment) @indent.auto
