#include <stdio.h>

#include "calc.h"

int main(int argc, char **argv)
{
    struct token tokens[MAX_TOKENS];
    double result;

    if (argc != 2) {
        fprintf(stderr, "usage: calc EXPRESSION\n");
        return 2;
    }
    if (tokenize(argv[1], tokens, MAX_TOKENS) < 0 || evaluate(tokens, &result) < 0) {
        fprintf(stderr, "calc: invalid expression: %s\n", argv[1]);
        return 1;
    }
    printf("%.10g\n", result);
    return 0;
}
