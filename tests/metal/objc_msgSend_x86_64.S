/* objc_msgSend for the Metal test double (x86-64 System V): looks up the method for
 * (receiver, selector) in C, then tail-jumps to it with every argument register and the
 * stack as the caller left them, so methods of any signature (structs passed in memory
 * included) receive their arguments. A nil receiver returns zero, as the real one does. */
    .text
    .globl objc_msgSend
    .type objc_msgSend, @function
objc_msgSend:
    test %rdi, %rdi
    jz 1f
    push %rbp
    mov %rsp, %rbp
    sub $192, %rsp
    mov %rdi, 0(%rsp)
    mov %rsi, 8(%rsp)
    mov %rdx, 16(%rsp)
    mov %rcx, 24(%rsp)
    mov %r8, 32(%rsp)
    mov %r9, 40(%rsp)
    mov %rax, 48(%rsp)
    movdqu %xmm0, 64(%rsp)
    movdqu %xmm1, 80(%rsp)
    movdqu %xmm2, 96(%rsp)
    movdqu %xmm3, 112(%rsp)
    movdqu %xmm4, 128(%rsp)
    movdqu %xmm5, 144(%rsp)
    movdqu %xmm6, 160(%rsp)
    movdqu %xmm7, 176(%rsp)
    call metal_double_lookup@PLT
    mov %rax, %r11
    mov 0(%rsp), %rdi
    mov 8(%rsp), %rsi
    mov 16(%rsp), %rdx
    mov 24(%rsp), %rcx
    mov 32(%rsp), %r8
    mov 40(%rsp), %r9
    mov 48(%rsp), %rax
    movdqu 64(%rsp), %xmm0
    movdqu 80(%rsp), %xmm1
    movdqu 96(%rsp), %xmm2
    movdqu 112(%rsp), %xmm3
    movdqu 128(%rsp), %xmm4
    movdqu 144(%rsp), %xmm5
    movdqu 160(%rsp), %xmm6
    movdqu 176(%rsp), %xmm7
    leave
    jmp *%r11
1:
    xor %eax, %eax
    xor %edx, %edx
    pxor %xmm0, %xmm0
    ret
    .size objc_msgSend, .-objc_msgSend
    .section .note.GNU-stack,"",@progbits
