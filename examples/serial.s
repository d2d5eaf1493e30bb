# Serial: the work of examples/overlap.s (y = relu(w.T @ x) over four [128, 512] column tiles), on the
# same queues and buffers, but every instruction waits for the one before it, so nothing overlaps and
# the modeled time is the sum of all durations.
# Each queue signals its own semaphore: s0 dma0, s1 dma1, s2 pe, s3 act, s4 dma2, s5 dma3; an
# instruction waits for the count its predecessor's queue reached with the predecessor's signal.
.target trn2
.tensor w input bf16 [128, 128]
.tensor x input bf16 [128, 2048]
.tensor y output bf16 [128, 2048]

# SBUF per partition: w at byte 0, x slots at 256 and 1280, y slots at 2304 and 3328 (bf16 [512] each).
dma0  dma_copy dst=sbuf[0:128]+0:bf16[1,128] src=w[128;128]+0:bf16[1,128] signal=s0

# tile 0
dma0  dma_copy dst=sbuf[0:128]+256:bf16[1,512] src=x[2048;128]+0:bf16[1,512] wait=s0>=1 signal=s0
pe    matmul dst=psum[0:128]+0:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+256:bf16[1,512] wait=s0>=2 signal=s2
act   activation dst=sbuf[0:128]+2304:bf16[1,512] src=psum[0:128]+0:fp32[1,512] func=relu wait=s2>=1 signal=s3
dma2  dma_copy dst=y[2048;128]+0:bf16[1,512] src=sbuf[0:128]+2304:bf16[1,512] wait=s3>=1 signal=s4

# tile 1
dma1  dma_copy dst=sbuf[0:128]+1280:bf16[1,512] src=x[2048;128]+1024:bf16[1,512] wait=s4>=1 signal=s1
pe    matmul dst=psum[0:128]+2048:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+1280:bf16[1,512] wait=s1>=1 signal=s2
act   activation dst=sbuf[0:128]+3328:bf16[1,512] src=psum[0:128]+2048:fp32[1,512] func=relu wait=s2>=2 signal=s3
dma3  dma_copy dst=y[2048;128]+1024:bf16[1,512] src=sbuf[0:128]+3328:bf16[1,512] wait=s3>=2 signal=s5

# tile 2
dma0  dma_copy dst=sbuf[0:128]+256:bf16[1,512] src=x[2048;128]+2048:bf16[1,512] wait=s5>=1 signal=s0
pe    matmul dst=psum[0:128]+0:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+256:bf16[1,512] wait=s0>=3 signal=s2
act   activation dst=sbuf[0:128]+2304:bf16[1,512] src=psum[0:128]+0:fp32[1,512] func=relu wait=s2>=3 signal=s3
dma2  dma_copy dst=y[2048;128]+2048:bf16[1,512] src=sbuf[0:128]+2304:bf16[1,512] wait=s3>=3 signal=s4

# tile 3
dma1  dma_copy dst=sbuf[0:128]+1280:bf16[1,512] src=x[2048;128]+3072:bf16[1,512] wait=s4>=2 signal=s1
pe    matmul dst=psum[0:128]+2048:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+1280:bf16[1,512] wait=s1>=2 signal=s2
act   activation dst=sbuf[0:128]+3328:bf16[1,512] src=psum[0:128]+2048:fp32[1,512] func=relu wait=s2>=4 signal=s3
dma3  dma_copy dst=y[2048;128]+3072:bf16[1,512] src=sbuf[0:128]+3328:bf16[1,512] wait=s3>=4
