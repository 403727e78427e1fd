/*
 * wordcount: print line, word and byte counts of a file, plus its longest word.
 *
 *   usage: wordcount FILE
 *
 * A word is a maximal run of bytes that are not whitespace (isspace). Lines are counted as
 * newline characters, like wc -l. The longest word is the first one of maximal length, or
 * "(none)" when the file holds no words.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct counts {
    long lines;
    long words;
    long chars;
    char *longest;
    size_t longest_len;
};

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (q == NULL) {
        fprintf(stderr, "wordcount: out of memory\n");
        exit(1);
    }
    return q;
}

static void finish_word(struct counts *c, const char *word, size_t len)
{
    c->words++;
    if (c->longest == NULL || len > c->longest_len) {
        c->longest = xrealloc(c->longest, len + 1);
        memcpy(c->longest, word, len + 1);
        c->longest_len = len;
    }
}

static void count_stream(FILE *fp, struct counts *c)
{
    size_t cap = 64, len = 0;
    char *word = xrealloc(NULL, cap);
    int ch;

    while ((ch = fgetc(fp)) != EOF) {
        c->chars++;
        if (ch == '\n')
            c->lines++;
        if (isspace(ch)) {
            if (len > 0) {
                word[len] = '\0';
                finish_word(c, word, len);
                len = 0;
            }
        } else {
            if (len + 1 >= cap) {
                cap *= 2;
                word = xrealloc(word, cap);
            }
            word[len++] = (char)ch;
        }
    }
    if (len > 0) {
        word[len] = '\0';
        finish_word(c, word, len);
    }
    free(word);
}

int main(int argc, char **argv)
{
    struct counts c = {0, 0, 0, NULL, 0};
    FILE *fp;

    if (argc != 2) {
        fprintf(stderr, "usage: wordcount FILE\n");
        return 2;
    }
    fp = fopen(argv[1], "r");
    if (fp == NULL) {
        fprintf(stderr, "wordcount: cannot open %s\n", argv[1]);
        return 1;
    }
    count_stream(fp, &c);
    fclose(fp);

    printf("lines: %ld\n", c.lines);
    printf("words: %ld\n", c.words);
    printf("chars: %ld\n", c.chars);
    printf("longest: %s\n", c.longest ? c.longest : "(none)");
    free(c.longest);
    return 0;
}
