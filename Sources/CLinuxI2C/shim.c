#include "CLinuxI2C.h"
