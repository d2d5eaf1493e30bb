# A hand-written GEMM: c[128, 512] = a[256, 128].T @ b[256, 512], bf16 inputs, fp32 accumulation.
# K = 256 is split into two tiles of 128 partitions that accumulate into one PSUM bank.
# Four DMA queues load the tiles in parallel; semaphores order each consumer after its producers.
.target trn2
.tensor a input bf16 [256, 128]
.tensor b input bf16 [256, 512]
.tensor c output fp32 [128, 512]

# SBUF per partition: a tiles at bytes 0 and 256, b tiles at 512 and 1536, the result at 2560.
dma0  dma_copy dst=sbuf[0:128]+0:bf16[1,128] src=a[128;128]+0:bf16[1,128] signal=s0
dma1  dma_copy dst=sbuf[0:128]+512:bf16[1,512] src=b[512;128]+0:bf16[1,512] signal=s1
dma2  dma_copy dst=sbuf[0:128]+256:bf16[1,128] src=a[128;128]+32768:bf16[1,128] signal=s2
dma3  dma_copy dst=sbuf[0:128]+1536:bf16[1,512] src=b[512;128]+131072:bf16[1,512] signal=s3

# K tile 0 overwrites the bank, K tile 1 accumulates into it.
pe    matmul dst=psum[0:128]+0:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+512:bf16[1,512] wait=s0>=1,s1>=1
pe    matmul dst=psum[0:128]+0:fp32[1,512] stationary=sbuf[0:128]+256:bf16[1,128] moving=sbuf[0:128]+1536:bf16[1,512] accumulate=1 wait=s2>=1,s3>=1 signal=s4

# Evacuate PSUM to SBUF on ScalarE, then store.
act   activation dst=sbuf[0:128]+2560:fp32[1,512] src=psum[0:128]+0:fp32[1,512] func=copy wait=s4>=1 signal=s5
dma0  dma_copy dst=c[512;128]+0:fp32[1,512] src=sbuf[0:128]+2560:fp32[1,512] wait=s5>=1
