#ifndef CALC_H
#define CALC_H

/* Token kinds produced by the lexer. */
enum token_kind { TOK_NUM, TOK_PLUS, TOK_MINUS, TOK_STAR, TOK_SLASH, TOK_CARET, TOK_LPAREN, TOK_RPAREN, TOK_END };

struct token {
    enum token_kind kind;
    double value; /* for TOK_NUM */
};

#define MAX_TOKENS 256

/* lexer.c: split text into tokens (the last one is TOK_END). Returns the count, or -1 on error. */
int tokenize(const char *text, struct token *out, int max);

/* eval.c: evaluate tokens. Returns 0 and stores the result, or -1 on a syntax error. */
int evaluate(const struct token *tokens, double *result);

#endif
