/* hpccomm-mpi-hello: checks the MPI toolchain and launcher without Python.
 *
 * Each rank prints "mpi hello: rank R of N on HOST" and rank 0 the library version;
 * an allreduce of the ranks checks that the ranks really talk to each other.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    int rank, size, sum = 0, namelen, verlen;
    char name[MPI_MAX_PROCESSOR_NAME], version[MPI_MAX_LIBRARY_VERSION_STRING];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &namelen);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Get_library_version(version, &verlen);
        version[strcspn(version, "\n")] = '\0';
        printf("mpi library: %s\n", version);
    }
    printf("mpi hello: rank %d of %d on %s, sum of ranks %d\n", rank, size, name, sum);
    MPI_Finalize();
    return sum == size * (size - 1) / 2 ? 0 : 1;
}
