wc -c < src/main.c
