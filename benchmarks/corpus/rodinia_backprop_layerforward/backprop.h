/* The macros of Rodinia 3.1 cuda/backprop/backprop.h that the kernels use (the declarations are host code). */
#define THREADS 256
#define WIDTH 16  // shared memory width  
#define HEIGHT 16 // shared memory height
#define ETA 0.3       //eta value
#define MOMENTUM 0.3  //momentum value
