/* main.c - the metrale-gpu command line. */
#include <stdio.h>

int main(void) {
    puts("metrale-gpu: not built yet");
    return 1;
}
