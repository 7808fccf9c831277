// External scanner for shard: the `(` of a call and the `[` of an index.
//
// pest's `same_line` lets only spaces and tabs stand between a callee and its
// `(` (or `[`): `f (x)` is a call, `f` then `(x)` on the next line is not.
// A grammar token `/[ \t]*\(/` said the same, but its leading blanks made the
// lexer start other tokens on the blank before them (`const X` gave the
// identifier " X"). Here the blanks are skipped, not taken into the token,
// so every node starts on its first character.

#include "tree_sitter/parser.h"

enum TokenType {
  CALL_OPEN,
  INDEX_OPEN,
};

void *tree_sitter_shard_external_scanner_create(void) { return NULL; }

void tree_sitter_shard_external_scanner_destroy(void *payload) { (void)payload; }

unsigned tree_sitter_shard_external_scanner_serialize(void *payload, char *buffer) {
  (void)payload;
  (void)buffer;
  return 0;
}

void tree_sitter_shard_external_scanner_deserialize(void *payload, const char *buffer,
                                                    unsigned length) {
  (void)payload;
  (void)buffer;
  (void)length;
}

bool tree_sitter_shard_external_scanner_scan(void *payload, TSLexer *lexer,
                                             const bool *valid_symbols) {
  (void)payload;
  bool call = valid_symbols[CALL_OPEN], index = valid_symbols[INDEX_OPEN];
  if (!call && !index) {
    return false;
  }
  while (lexer->lookahead == ' ' || lexer->lookahead == '\t') {
    lexer->advance(lexer, true);
  }
  if (call && lexer->lookahead == '(') {
    lexer->advance(lexer, false);
    lexer->result_symbol = CALL_OPEN;
    return true;
  }
  if (index && lexer->lookahead == '[') {
    lexer->advance(lexer, false);
    lexer->result_symbol = INDEX_OPEN;
    return true;
  }
  return false;
}
