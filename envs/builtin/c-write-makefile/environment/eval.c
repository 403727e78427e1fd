#include <math.h>

#include "calc.h"

/*
 * Recursive descent:
 *   expr   := term (('+' | '-') term)*
 *   term   := unary (('*' | '/') unary)*
 *   unary  := '-' unary | power
 *   power  := atom ('^' unary)?        (right associative)
 *   atom   := NUM | '(' expr ')'
 */
struct parser {
    const struct token *tok;
    int error;
};

static double expr(struct parser *p);

static double atom(struct parser *p)
{
    if (p->tok->kind == TOK_NUM) {
        double v = p->tok->value;
        p->tok++;
        return v;
    }
    if (p->tok->kind == TOK_LPAREN) {
        double v;
        p->tok++;
        v = expr(p);
        if (p->tok->kind != TOK_RPAREN) {
            p->error = 1;
            return 0;
        }
        p->tok++;
        return v;
    }
    p->error = 1;
    return 0;
}

static double unary(struct parser *p);

static double power(struct parser *p)
{
    double base = atom(p);
    if (p->tok->kind == TOK_CARET) {
        p->tok++;
        return pow(base, unary(p));
    }
    return base;
}

static double unary(struct parser *p)
{
    if (p->tok->kind == TOK_MINUS) {
        p->tok++;
        return -unary(p);
    }
    return power(p);
}

static double term(struct parser *p)
{
    double v = unary(p);
    while (!p->error && (p->tok->kind == TOK_STAR || p->tok->kind == TOK_SLASH)) {
        enum token_kind op = p->tok->kind;
        double rhs;
        p->tok++;
        rhs = unary(p);
        v = op == TOK_STAR ? v * rhs : v / rhs;
    }
    return v;
}

static double expr(struct parser *p)
{
    double v = term(p);
    while (!p->error && (p->tok->kind == TOK_PLUS || p->tok->kind == TOK_MINUS)) {
        enum token_kind op = p->tok->kind;
        double rhs;
        p->tok++;
        rhs = term(p);
        v = op == TOK_PLUS ? v + rhs : v - rhs;
    }
    return v;
}

int evaluate(const struct token *tokens, double *result)
{
    struct parser p = {tokens, 0};
    double v = expr(&p);
    if (p.error || p.tok->kind != TOK_END)
        return -1;
    *result = v;
    return 0;
}
