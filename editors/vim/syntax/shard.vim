" Vim syntax file
" Language:   shard (shardc model definitions, *.shard)
" Keywords and tokens follow grammar/shard.pest.

if exists('b:current_syntax')
  finish
endif

let s:cpo_save = &cpo
set cpo&vim

syn case match

" Items and statements
syn keyword shardInclude      import pragma
syn keyword shardStructure    const mesh layer model table feature train
syn keyword shardKeyword      fn let init local on
syn keyword shardType         f32 f16 bf16 f64 i32 i64 bool

" Collectives (every one of them moves data between devices) and built-in
" functions, from the primitives' registry (src/prim).
" registry (generated; SHARDC_BLESS=1 cargo test --test registry rewrites it)
syn keyword shardCollective   psum pmean pmax pmin reduce all_gather psum_scatter
syn keyword shardCollective   all_to_all ppermute axis_index
syn keyword shardBuiltin      relu gelu silu tanh exp log sqrt rsqrt sigmoid square abs
syn keyword shardBuiltin      sin cos softplus log_sigmoid erf gelu_exact softmax
syn keyword shardBuiltin      log_softmax layer_norm rms_norm sum mean max min einsum
syn keyword shardBuiltin      reshape transpose split cast stop_gradient stack concat
syn keyword shardBuiltin      maximum minimum clamp pow greater greater_equal less
syn keyword shardBuiltin      less_equal equal not_equal where argmax argmin top_k
syn keyword shardBuiltin      top_k_indices cumsum var take_along_axis scatter_add
syn keyword shardBuiltin      arange broadcast_to repeat dropout one_hot embed lookup
syn keyword shardBuiltin      causal_attention attention softmax_cross_entropy
syn keyword shardBuiltin      softmax_cross_entropy_rows add_loss observe step_total
" A collective's mesh axes: `psum(x, mp)`, `all_gather(x, mp, dim: 1)`.
syn match   shardCollectiveAxis "\%(\<\%(axis_index\)\s*(\%(\s*\h\w*\s*,\)*\s*\)\@200<=\h\w*\>\%(\s*[:([@.]\)\@!"
syn match   shardCollectiveAxis "\%(\<\%(psum\|pmean\|pmax\|pmin\|all_gather\|psum_scatter\|all_to_all\|ppermute\)\s*(\%([^,()]\|([^()]*)\)*,\%(\s*\h\w*\s*,\)*\s*\)\@200<=\h\w*\>\%(\s*[:([@.]\)\@!"
" /registry

" Layer directives; initializers, combiners and mesh kinds written bare.
syn keyword shardBuiltin      repeat shard_params freeze checkpoint
syn keyword shardConstant     zeros ones xavier lecun sqrtn virtual cuda mpi
" Library calls (initializers, `rows`, and the optimizers, schedules and data
" sources of src/vocab) and bare words with a meaning (losses, metrics, pipeline
" schedules), from the registries.
" vocabulary (generated; SHARDC_BLESS=1 cargo test --test registry rewrites it)
syn keyword shardBuiltin      repeat shard_params normal truncated_normal uniform
syn keyword shardBuiltin      constant rows sgd adam adamw adagrad ftrl lion muon
syn keyword shardBuiltin      warmup_cosine warmup_linear warmup_constant inverse_sqrt
syn keyword shardBuiltin      wsd shakespeare_words shakespeare_chars text tokens arrays
syn keyword shardBuiltin      synthetic clicks
syn keyword shardConstant     mse sigmoid_binary_cross_entropy accuracy auc gpipe
syn keyword shardConstant     one_f_one_b interleaved zb_h1 zbv jsonl tensorboard
" /vocabulary

" Names: declarations, upper-case constants and sizes
syn match   shardDeclName     "\%(\<\%(mesh\|layer\|model\|table\)\s\+\)\@<=\h\w*"
syn match   shardFuncName     "\%(\<fn\s\+\)\@<=\h\w*"
syn match   shardSize         "\<[A-Z][A-Z0-9_]*\>"

" Shardings: `D@mp`, `B@(dp, fsdp)`, `D@_`. A `@` right after a name, number
" or `)` is a sharding; `x @ w` (with spaces) is the matmul operator.
syn match   shardSharding     "\%(\w\|)\)\@1<=@\s*\%(\h\w*\|(\s*\h\w*\%(\s*,\s*\h\w*\)*\s*)\)"
" Pending reductions: `partial(mp)`, `partial(max: mp)`
syn region  shardPending      matchgroup=shardPartial start="\<partial\s*(" end=")" oneline contains=shardReduceOp,shardAxisName
syn match   shardReduceOp     contained "\<\%(sum\|max\|min\)\ze\s*:"
syn match   shardAxisName     contained "\<\h\w*\>\%(\s*:\)\@!"
syn match   shardOperator     "->\|[-+*/=]\|\s\@1<=@\|\.\.\."

" Literals
syn match   shardInteger      "\<\d[0-9_]*\>"
syn match   shardFloat        "\<\d\+\.\d\+\>"
syn match   shardFloat        "\<\d\+\%(\.\d\+\)\=[eE][+-]\=\d\+\>"
syn region  shardString       start=+"+ end=+"+ oneline contains=@Spell

" Comments
syn keyword shardTodo         contained TODO FIXME XXX NOTE
syn match   shardLineComment  "//.*$" contains=shardTodo,@Spell
syn region  shardBlockComment start="/\*" end="\*/" contains=shardTodo,@Spell

hi def link shardInclude      Include
hi def link shardStructure    Structure
hi def link shardKeyword      Keyword
hi def link shardType         Type
hi def link shardPartial      StorageClass
hi def link shardCollective   Special
hi def link shardBuiltin      Function
hi def link shardConstant     Constant
hi def link shardDeclName     Typedef
hi def link shardFuncName     Function
hi def link shardSize         Constant
hi def link shardSharding     PreProc
hi def link shardAxisName     PreProc
hi def link shardCollectiveAxis PreProc
hi def link shardReduceOp     Operator
hi def link shardOperator     Operator
hi def link shardInteger      Number
hi def link shardFloat        Float
hi def link shardString       String
hi def link shardTodo         Todo
hi def link shardLineComment  Comment
hi def link shardBlockComment Comment

let b:current_syntax = 'shard'

let &cpo = s:cpo_save
unlet s:cpo_save
