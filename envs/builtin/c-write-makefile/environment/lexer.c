#include <ctype.h>
#include <stdlib.h>

#include "calc.h"

int tokenize(const char *text, struct token *out, int max)
{
    int n = 0;
    const char *p = text;

    while (*p) {
        if (isspace((unsigned char)*p)) {
            p++;
            continue;
        }
        if (n >= max - 1)
            return -1;
        if (isdigit((unsigned char)*p) || *p == '.') {
            char *end;
            out[n].kind = TOK_NUM;
            out[n].value = strtod(p, &end);
            if (end == p)
                return -1;
            p = end;
            n++;
            continue;
        }
        switch (*p) {
        case '+': out[n].kind = TOK_PLUS; break;
        case '-': out[n].kind = TOK_MINUS; break;
        case '*': out[n].kind = TOK_STAR; break;
        case '/': out[n].kind = TOK_SLASH; break;
        case '^': out[n].kind = TOK_CARET; break;
        case '(': out[n].kind = TOK_LPAREN; break;
        case ')': out[n].kind = TOK_RPAREN; break;
        default: return -1;
        }
        n++;
        p++;
    }
    out[n].kind = TOK_END;
    return n + 1;
}
