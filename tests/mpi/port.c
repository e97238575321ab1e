/* MPI_Comm_accept / MPI_Comm_connect through a port name in a file: "port accept FILE" opens a
   port, writes its name to FILE and waits for a client; "port connect FILE" connects to the port
   named in FILE.  Each side prints a line when connected. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc < 3) return 2;
  char port[MPI_MAX_PORT_NAME] = {0};
  MPI_Comm other;
  if (strcmp(argv[1], "accept") == 0) {
    MPI_Open_port(MPI_INFO_NULL, port);
    FILE* f = fopen(argv[2], "w");
    if (!f) return 3;
    fputs(port, f);
    fclose(f);
    MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &other);
  } else {
    FILE* f = fopen(argv[2], "r");
    if (!f || !fgets(port, sizeof port, f)) return 3;
    fclose(f);
    MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &other);
  }
  printf("%s: connected\n", argv[1]);
  MPI_Comm_disconnect(&other);
  MPI_Finalize();
  return 0;
}
