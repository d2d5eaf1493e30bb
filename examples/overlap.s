# Overlap: y = relu(w.T @ x) over four column tiles of x, double-buffered so DMA overlaps compute.
# w[128, 128] is the stationary operand; x[128, 2048] and y[128, 2048] are four [128, 512] tiles each.
# Loads alternate between dma0 and dma1 into two SBUF slots, matmuls alternate between two PSUM
# banks, ScalarE evacuates each bank through relu into two output slots, and dma2/dma3 store them.
# Semaphores (each signalled from one queue): s0 w loaded (dma0), s1 x slot 0 loaded (dma0),
# s2 x slot 1 loaded (dma1), s3 matmuls done (pe), s4 activations done (act), s5 and s6 stores of
# y slot 0 and slot 1 done (dma2, dma3). A load into a slot waits for the matmul that last read it,
# a matmul waits for the activation that last read its bank, an activation for the store that last
# read its output slot. examples/serial.s does the same work with every step waiting for the last.
.target trn2
.tensor w input bf16 [128, 128]
.tensor x input bf16 [128, 2048]
.tensor y output bf16 [128, 2048]

# SBUF per partition: w at byte 0, x slots at 256 and 1280, y slots at 2304 and 3328 (bf16 [512] each).
dma0  dma_copy dst=sbuf[0:128]+0:bf16[1,128] src=w[128;128]+0:bf16[1,128] signal=s0
dma0  dma_copy dst=sbuf[0:128]+256:bf16[1,512] src=x[2048;128]+0:bf16[1,512] signal=s1
dma1  dma_copy dst=sbuf[0:128]+1280:bf16[1,512] src=x[2048;128]+1024:bf16[1,512] signal=s2

# tile 0: slot 0, bank 0
pe    matmul dst=psum[0:128]+0:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+256:bf16[1,512] wait=s0>=1,s1>=1 signal=s3
act   activation dst=sbuf[0:128]+2304:bf16[1,512] src=psum[0:128]+0:fp32[1,512] func=relu wait=s3>=1 signal=s4
dma2  dma_copy dst=y[2048;128]+0:bf16[1,512] src=sbuf[0:128]+2304:bf16[1,512] wait=s4>=1 signal=s5
dma0  dma_copy dst=sbuf[0:128]+256:bf16[1,512] src=x[2048;128]+2048:bf16[1,512] wait=s3>=1 signal=s1

# tile 1: slot 1, bank 1
pe    matmul dst=psum[0:128]+2048:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+1280:bf16[1,512] wait=s2>=1 signal=s3
act   activation dst=sbuf[0:128]+3328:bf16[1,512] src=psum[0:128]+2048:fp32[1,512] func=relu wait=s3>=2 signal=s4
dma3  dma_copy dst=y[2048;128]+1024:bf16[1,512] src=sbuf[0:128]+3328:bf16[1,512] wait=s4>=2 signal=s6
dma1  dma_copy dst=sbuf[0:128]+1280:bf16[1,512] src=x[2048;128]+3072:bf16[1,512] wait=s3>=2 signal=s2

# tile 2: slot 0, bank 0
pe    matmul dst=psum[0:128]+0:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+256:bf16[1,512] wait=s1>=2,s4>=1 signal=s3
act   activation dst=sbuf[0:128]+2304:bf16[1,512] src=psum[0:128]+0:fp32[1,512] func=relu wait=s3>=3,s5>=1 signal=s4
dma2  dma_copy dst=y[2048;128]+2048:bf16[1,512] src=sbuf[0:128]+2304:bf16[1,512] wait=s4>=3 signal=s5

# tile 3: slot 1, bank 1
pe    matmul dst=psum[0:128]+2048:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+1280:bf16[1,512] wait=s2>=2,s4>=2 signal=s3
act   activation dst=sbuf[0:128]+3328:bf16[1,512] src=psum[0:128]+2048:fp32[1,512] func=relu wait=s3>=4,s6>=1 signal=s4
dma3  dma_copy dst=y[2048;128]+3072:bf16[1,512] src=sbuf[0:128]+3328:bf16[1,512] wait=s4>=4
