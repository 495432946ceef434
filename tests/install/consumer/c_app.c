/* The installed C API from C: the library's version, and a clear error for a missing file. */
#include <stdio.h>
#include <string.h>

#include "gpufeed/c_api.h"

int main(void) {
  gpufeed_error* err = NULL;
  gpufeed_options* o = gpufeed_options_create();
  gpufeed_loader* l = gpufeed_loader_open("/nonexistent/gpufeed-install-test.h5", o, &err);
  gpufeed_options_destroy(o);
  if (l != NULL || err == NULL || strstr(gpufeed_error_message(err), "gpufeed-install-test.h5") == NULL) {
    fprintf(stderr, "c_app: expected an error naming the missing file\n");
    return 1;
  }
  printf("c_app: gpufeed %s; missing file -> %s\n", gpufeed_version(), gpufeed_error_message(err));
  gpufeed_error_destroy(err);
  return 0;
}
