/**
 * @file Tree-sitter grammar for shard (.shard files).
 *
 * Mirrors grammar/shard.pest, which stays the authoritative grammar: node
 * names follow the pest rule names. Deliberate differences, all in tree shape
 * only (the same texts parse): binary expressions are nested with precedence
 * instead of pest's flat `postfix (bin_op postfix)*` list; wrapper rules that
 * carry no information (`item`, `member`, `arg`, `list_item`, `primary`) are
 * hidden; and a call argument written `SIZE@axes` with no space before the `@`
 * (`Embed(VOCAB@mp, D)`, `GPTJBlock(D, H@mp)`) is a `dim`, the sharded size
 * the checker reads it as, where pest has a matmul expression (`x @ w`, with
 * spaces, stays one). Like pest's `same_line`, a call's `(` and an index's
 * `[` must be on the callee's line.
 */

/* eslint-disable arrow-parens, camelcase */
/// <reference types="tree-sitter-cli/dsl" />
// @ts-check

const KEYWORDS = [
  'import', 'pragma', 'const', 'mesh', 'layer', 'model', 'table', 'feature',
  'train', 'fn', 'let', 'init', 'local', 'on',
];

const DTYPES = ['f32', 'f16', 'bf16', 'f64', 'i32', 'i64', 'bool'];

// As src/parse.rs ranks pest's flat operator list: `@` binds tighter than
// `* /`, a sign tighter than any binary operator.
const PREC = {
  add: 1,
  mul: 2,
  matmul: 3,
  unary: 4,
  postfix: 5,
};

/** `rule ("," rule)* ","?` */
const commaSep1 = (rule) => seq(rule, repeat(seq(',', rule)), optional(','));

/** `(rule ("," rule)* ","?)?` */
const commaSep = (rule) => optional(commaSep1(rule));

module.exports = grammar({
  name: 'shard',

  word: $ => $.ident,

  extras: $ => [/\s/, $.comment],

  // The `(` of a call and the `[` of an index, on the callee's line
  // (src/scanner.c: the blanks before them are skipped, not part of them).
  externals: $ => [$._call_open, $._index_open],

  // Inside `[...]` lists and call arguments a size expression (`4*D@mp`,
  // `D -> FF@mp`) and an ordinary expression look alike for a while; the GLR
  // parser keeps both and, as pest does, prefers the dimension reading.
  conflicts: $ => [
    [$._dim_expr, $._primary],
    [$._sharded_size, $._at],
  ],

  rules: {
    file: $ => repeat($._item),

    _item: $ => choice(
      $.import,
      $.pragma,
      $.const_decl,
      $.mesh_decl,
      $.layer_decl,
      $.model_decl,
      $.table_decl,
      $.feature_decl,
      $.train_decl,
    ),

    // ── items ──────────────────────────────────────────────────────────────
    import: $ => seq('import', field('path', choice($.string, $.ident))),

    pragma: $ => seq('pragma', field('name', $.ident)),

    const_decl: $ => seq('const', field('name', $.ident), '=', field('value', $._dim_expr)),

    mesh_decl: $ => seq(
      'mesh',
      field('name', $.ident),
      '(', optional($.axis_list), ')',
      optional(field('options', $.options)),
    ),

    axis_list: $ => commaSep1($.axis_def),

    axis_def: $ => seq(field('name', $.ident), ':', field('size', $._dim_expr)),

    layer_decl: $ => seq(
      'layer',
      field('name', $.ident),
      optional(seq('(', optional(field('parameters', $.param_list)), ')')),
      field('body', $.body),
    ),

    model_decl: $ => seq('model', field('name', $.ident), field('body', $.body)),

    param_list: $ => seq($.ident, repeat(seq(choice(',', '->'), $.ident)), optional(',')),

    body: $ => seq('{', repeat($._member), '}'),

    _member: $ => choice($.fn_decl, $.weight_decl, $.sublayer, $.directive),

    weight_decl: $ => seq(
      field('name', $.ident),
      ':',
      field('type', $.tensor_type),
      optional(seq('init', field('init', $._expr))),
    ),

    sublayer: $ => seq(field('name', $.ident), '=', field('value', $._expr)),

    // Unlike a call's, a directive's `(` may be on a later line.
    directive: $ => seq(
      field('name', $.ident),
      field('arguments', alias($._directive_args, $.call_args)),
    ),

    _directive_args: $ => seq('(', commaSep($._arg), ')'),

    fn_decl: $ => seq(
      'fn',
      field('name', $.ident),
      '(', optional(field('parameters', $.fn_params)), ')',
      optional(seq('->', field('return_type', $.tensor_type))),
      field('body', $.block),
    ),

    fn_params: $ => commaSep1($.fn_param),

    fn_param: $ => seq(field('name', $.ident), ':', field('type', $.tensor_type)),

    table_decl: $ => seq('table', field('name', $.ident), field('options', $.options)),

    feature_decl: $ => seq(
      'feature',
      field('name', $.ident),
      ':',
      field('type', $.tensor_type),
      '->',
      field('table', $.ident),
    ),

    train_decl: $ => seq(
      'train',
      field('model', $.ident),
      'on',
      field('mesh', $.ident),
      field('options', $.options),
    ),

    // pest: `"{" ~ (option ~ ","?)* ~ "}"`: commas between options are optional.
    options: $ => seq('{', repeat(seq($.option, optional(','))), '}'),

    option: $ => seq(field('key', $.key), ':', field('value', choice($.options, $._expr))),

    // ── types ──────────────────────────────────────────────────────────────
    tensor_type: $ => seq(
      field('dtype', $.dtype),
      '[', commaSep($.dim), ']',
      optional(field('pending', $.pending)),
    ),

    dtype: _ => choice(...DTYPES),

    dim: $ => prec.dynamic(1, choice($.ellipsis, $._dim_with_axes)),

    _dim_with_axes: $ => seq(
      field('size', $._dim_expr),
      optional(seq($._at, field('axes', $.axes))),
    ),

    // `SIZE@axes` as a call argument (no space before `@`): a sharded size.
    _sharded_size: $ => prec.dynamic(2, seq(
      field('size', $._dim_expr),
      alias(token.immediate('@'), '@'),
      field('axes', $.axes),
    )),

    // `@` with or without a space before it.
    _at: _ => choice('@', alias(token.immediate('@'), '@')),

    ellipsis: _ => '...',

    axes: $ => choice(
      $.ident,
      seq('(', $.ident, repeat(seq(',', $.ident)), ')'),
      $.replicated,
    ),

    replicated: _ => '_',

    pending: $ => seq('partial', '(', $.pending_item, repeat(seq(',', $.pending_item)), ')'),

    pending_item: $ => seq(
      optional(seq(field('op', $.reduce_op), ':')),
      field('axis', $.ident),
    ),

    reduce_op: _ => choice('sum', 'max', 'min'),

    _dim_expr: $ => choice($.int, $.ident, $.dim_paren, $.dim_binary),

    dim_paren: $ => seq('(', $._dim_expr, ')'),

    dim_binary: $ => choice(
      prec.left(PREC.add, seq(
        field('left', $._dim_expr), field('operator', choice('+', '-')), field('right', $._dim_expr),
      )),
      prec.left(PREC.mul, seq(
        field('left', $._dim_expr), field('operator', choice('*', '/')), field('right', $._dim_expr),
      )),
    ),

    // ── statements and expressions ─────────────────────────────────────────
    block: $ => seq('{', repeat($.let_stmt), optional(field('result', $._expr)), '}'),

    let_stmt: $ => seq(
      'let',
      choice(field('name', $.ident), field('names', $.let_names)),
      optional(seq(':', field('type', $.tensor_type))),
      '=',
      field('value', $._expr),
      optional(';'),
    ),

    // `let (q, k, v) = split(...)`: one name per result.
    let_names: $ => seq('(', field('name', $.ident), repeat1(seq(',', field('name', $.ident))), optional(','), ')'),

    _expr: $ => choice($.binary_expr, $.unary_expr, $._postfix),

    binary_expr: $ => choice(
      prec.left(PREC.add, seq(
        field('left', $._expr), field('operator', choice('+', '-')), field('right', $._expr),
      )),
      prec.left(PREC.mul, seq(
        field('left', $._expr), field('operator', choice('*', '/')), field('right', $._expr),
      )),
      prec.left(PREC.matmul, seq(
        field('left', $._expr), field('operator', $._at), field('right', $._expr),
      )),
    ),

    unary_expr: $ => prec(PREC.unary, seq(field('operator', '-'), field('operand', $._expr))),

    _postfix: $ => choice($.call_expr, $.index_expr, $.member_expr, $._primary),

    call_expr: $ => prec(PREC.postfix, seq(
      field('function', $._postfix),
      field('arguments', $.call_args),
    )),

    index_expr: $ => prec(PREC.postfix, seq(field('value', $._postfix), field('index', $.index))),

    // `embed.w`: a sublayer's weight (pest's `member_access`, no spaces).
    member_expr: $ => prec(PREC.postfix, seq(
      field('value', $._postfix),
      token.immediate('.'),
      field('member', alias(token.immediate(/[A-Za-z_][A-Za-z0-9_]*/), $.ident)),
    )),

    _primary: $ => choice($.local_block, $.paren, $.list, $.float, $.int, $.string, $.ident),

    local_block: $ => seq(
      'local',
      optional(seq('(', field('axis', $.ident), repeat(seq(',', field('axis', $.ident))), ')')),
      field('body', $.block),
    ),

    paren: $ => seq('(', $._expr, ')'),

    list: $ => seq('[', commaSep($._list_item), ']'),

    // pest: `dim ~ !(bin_op | "(" | "[") | expr` — a size with an optional
    // sharding wins when both readings parse.
    _list_item: $ => choice($.dim, $._expr),

    // pest's `same_line`: only spaces and tabs between the callee and `(`.
    call_args: $ => seq(alias($._call_open, '('), commaSep($._arg), ')'),

    _arg: $ => choice($.arrow_arg, $.named_arg, alias($._sharded_size, $.dim), $._expr),

    arrow_arg: $ => seq(
      field('from', alias($._dim_with_axes, $.dim)),
      '->',
      field('to', alias($._dim_with_axes, $.dim)),
    ),

    named_arg: $ => seq(field('key', $.key), ':', field('value', choice($.options, $._expr))),

    index: $ => seq(
      alias($._index_open, '['),
      $.slice,
      repeat(seq(',', $.slice)),
      ']',
    ),

    slice: $ => choice(
      seq(optional(field('start', $._dim_expr)), ':', optional(field('end', $._dim_expr))),
      field('at', $._dim_expr),
    ),

    // ── tokens ─────────────────────────────────────────────────────────────
    // Option and argument keys may be keywords (`init: normal(1.0)`).
    key: $ => choice($.ident, ...KEYWORDS.map(k => alias(k, $.ident))),

    ident: _ => /[A-Za-z_][A-Za-z0-9_]*/,

    int: _ => /[0-9][0-9_]*/,

    float: _ => token(choice(
      /[0-9]+(\.[0-9]+)?[eE][+-]?[0-9]+/,
      /[0-9]+\.[0-9]+/,
    )),

    string: _ => token(seq('"', /[^"\n]*/, '"')),

    comment: _ => token(choice(
      seq('//', /[^\n]*/),
      seq('/*', /[^*]*\*+([^/*][^*]*\*+)*/, '/'),
    )),
  },
});
