@0xf3b1f17e25a4285b;   # openpilot's log.capnp file id: types get openpilot's ids from it (and from the names below)
using Car = import "car.capnp";

# The part of openpilot's cereal schema the model daemons and their tools use, wire-compatible with openpilot:
# the same file and type ids, field ordinals and union discriminants, so a message written here reads the same in
# openpilot's tools (LogReader, PlotJuggler, cabana, replay) and an openpilot message reads the same here. Names, units
# and meanings are openpilot's. Cap'n Proto ordinals have no holes, so a struct declares every field up to the last one
# used here (where a field sits depends on all fields before it). A member whose content this project never reads is
# declared as AnyPointer: the same pointer slot and discriminant, with no type behind it; a struct stops at its last
# used field (an openpilot message with more fields reads fine, the rest is skipped).
# Units: metres, seconds, radians, m/s unless a name says otherwise; timestamps are CLOCK_MONOTONIC nanoseconds.
# Names are those of the schema openpilot publishes on PyPI (openpilot-logging); fields newer than it (liveDelay,
# driverStateV2's sleepProb @14, driverMonitoringState @151, ...) carry openpilot v0.11.1's names, and so does Event @71,
# which v0.11.1 renamed driverMonitoringStateDEPRECATED when @151 took its name. Later openpilot renamed a few (sleepProb
# is eyesVisibleProb there, ThermalStatus has other enumerant names): same ordinals, so the same bytes on the wire.

struct Event {
  logMonoTime @0 :UInt64;   # when the message was made
  valid @67 :Bool = true;   # false: the producer knows the content is not to be trusted

  union {
    initData @1 :InitData;
    roadCameraState @2 :FrameData;
    gpsNMEA @3 :AnyPointer; sensorEventDEPRECATED @4 :AnyPointer; can @5 :AnyPointer;
    deviceState @6 :DeviceState;
    controlsState @7 :AnyPointer; liveEventDEPRECATED @8 :AnyPointer; model @9 :AnyPointer;
    featuresDEPRECATED @10 :AnyPointer; sensorEventsDEPRECATED @11 :AnyPointer; pandaStateDEPRECATED @12 :AnyPointer;
    radarState @13 :AnyPointer; liveUIDEPRECATED @14 :AnyPointer;
    roadEncodeIdx @15 :EncodeIndex;
    liveTracksDEPRECATED @16 :AnyPointer; sendcan @17 :AnyPointer;
    logMessage @18 :Text;
    liveCalibration @19 :LiveCalibrationData;
    androidLog @20 :AnyPointer; gpsLocation @21 :AnyPointer;
    carState @22 :Car.CarState;
    carControl @23 :Car.CarControl;
    longitudinalPlan @24 :AnyPointer; liveLocationDEPRECATED @25 :AnyPointer; ethernetDataDEPRECATED @26 :AnyPointer;
    navUpdateDEPRECATED @27 :AnyPointer; cellInfoDEPRECATED @28 :AnyPointer; wifiScanDEPRECATED @29 :AnyPointer;
    androidGnssDEPRECATED @30 :AnyPointer; qcomGnss @31 :AnyPointer; lidarPtsDEPRECATED @32 :AnyPointer;
    procLog @33 :AnyPointer; ubloxGnss @34 :AnyPointer; clocks @35 :AnyPointer;
    liveMpcDEPRECATED @36 :AnyPointer; liveLongitudinalMpcDEPRECATED @37 :AnyPointer; navStatusDEPRECATED @38 :AnyPointer;
    ubloxRaw @39 :Data;
    gpsPlannerPointsDEPRECATED @40 :AnyPointer; gpsPlannerPlanDEPRECATED @41 :AnyPointer;
    applanixRawDEPRECATED @42 :Data;
    trafficEventsDEPRECATED @43 :AnyPointer; liveLocationTimingDEPRECATED @44 :AnyPointer; orbslamCorrectionDEPRECATED @45 :AnyPointer;
    liveLocationCorrectedDEPRECATED @46 :AnyPointer; orbObservationDEPRECATED @47 :AnyPointer; gpsLocationExternal @48 :AnyPointer;
    locationDEPRECATED @49 :AnyPointer; uiNavigationEventDEPRECATED @50 :AnyPointer; liveLocationKalmanLegacyDEPRECATED @51 :AnyPointer;
    testJoystick @52 :AnyPointer; orbOdometryDEPRECATED @53 :AnyPointer; orbFeaturesDEPRECATED @54 :AnyPointer;
    applanixLocationDEPRECATED @55 :AnyPointer; orbKeyFrameDEPRECATED @56 :AnyPointer; uiLayoutStateDEPRECATED @57 :AnyPointer;
    orbFeaturesSummaryDEPRECATED @58 :AnyPointer; driverStateDEPRECATED @59 :AnyPointer; boot @60 :AnyPointer;
    liveParameters @61 :AnyPointer; liveMapDataDEPRECATED @62 :AnyPointer;
    cameraOdometry @63 :CameraOdometry;
    lateralPlanDEPRECATED @64 :AnyPointer; kalmanOdometryDEPRECATED @65 :AnyPointer; thumbnail @66 :AnyPointer;
    onroadEventsDEPRECATED @68 :AnyPointer; carParams @69 :AnyPointer;
    driverCameraState @70 :FrameData;
    driverMonitoringStateDEPRECATED @71 :DriverMonitoringStateDEPRECATED;   # v0.11.1's name: @151 took the old one
    liveLocationKalmanDEPRECATED @72 :AnyPointer; sentinel @73 :AnyPointer;
    wideRoadCameraState @74 :FrameData;
    modelV2 @75 :ModelDataV2;
    driverEncodeIdx @76 :EncodeIndex;
    wideRoadEncodeIdx @77 :EncodeIndex;
    managerState @78 :AnyPointer; uploaderState @79 :AnyPointer; peripheralState @80 :AnyPointer;
    pandaStates @81 :AnyPointer; navInstruction @82 :AnyPointer; navRoute @83 :AnyPointer;
    navThumbnail @84 :AnyPointer;
    errorLogMessage @85 :Text;
    roadEncodeData @86 :EncodeData; driverEncodeData @87 :EncodeData; wideRoadEncodeData @88 :EncodeData;
    qRoadEncodeData @89 :EncodeData;
    qRoadEncodeIdx @90 :EncodeIndex;
    gnssMeasurements @91 :AnyPointer;
    driverStateV2 @92 :DriverStateV2;
    userFlag @93 :AnyPointer; liveTorqueParameters @94 :AnyPointer; magnetometer @95 :AnyPointer;
    lightSensor @96 :AnyPointer; temperatureSensor @97 :AnyPointer; accelerometer @98 :AnyPointer;
    gyroscope @99 :AnyPointer; gyroscope2 @100 :AnyPointer; accelerometer2 @101 :AnyPointer;
    uiDebug @102 :AnyPointer; microphone @103 :AnyPointer; navModelDEPRECATED @104 :AnyPointer;
    mapRenderState @105 :AnyPointer; uiPlanDEPRECATED @106 :AnyPointer; customReserved0 @107 :AnyPointer;
    customReserved1 @108 :AnyPointer; customReserved2 @109 :AnyPointer; customReserved3 @110 :AnyPointer;
    customReserved4 @111 :AnyPointer; customReserved5 @112 :AnyPointer; customReserved6 @113 :AnyPointer;
    customReserved7 @114 :AnyPointer; customReserved8 @115 :AnyPointer; customReserved9 @116 :AnyPointer;
    livestreamRoadEncodeIdx @117 :EncodeIndex;
    livestreamWideRoadEncodeIdx @118 :EncodeIndex;
    livestreamDriverEncodeIdx @119 :EncodeIndex;
    livestreamRoadEncodeData @120 :EncodeData; livestreamWideRoadEncodeData @121 :EncodeData; livestreamDriverEncodeData @122 :EncodeData;
    temperatureSensor2 @123 :AnyPointer;
    customReservedRawData0 @124 :Data;
    customReservedRawData1 @125 :Data;
    customReservedRawData2 @126 :Data;
    carOutput @127 :AnyPointer;
    drivingModelData @128 :DrivingModelData;
    livePose @129 :AnyPointer; selfdriveState @130 :SelfdriveState; liveTracks @131 :AnyPointer;
    driverAssistance @132 :AnyPointer; alertDebug @133 :AnyPointer; onroadEvents @134 :AnyPointer;
    touch @135 :AnyPointer; customReserved10 @136 :AnyPointer; customReserved11 @137 :AnyPointer;
    customReserved12 @138 :AnyPointer; customReserved13 @139 :AnyPointer; customReserved14 @140 :AnyPointer;
    customReserved15 @141 :AnyPointer; customReserved16 @142 :AnyPointer; customReserved17 @143 :AnyPointer;
    customReserved18 @144 :AnyPointer; customReserved19 @145 :AnyPointer;
    liveDelay @146 :LiveDelayData;
    rawAudioData @147 :AnyPointer; bookmarkButton @148 :AnyPointer; audioFeedback @149 :AnyPointer;
    lateralManeuverPlan @150 :AnyPointer;
    driverMonitoringState @151 :DriverMonitoringState;
  }
}

struct InitData {   # first event of every log segment
  kernelArgs @0 :List(Text);
  gctxDEPRECATED @1 :Text;
  dongleId @2 :Text;
  deviceType @3 :DeviceType;
  version @4 :Text;
  androidBuildInfo @5 :AnyPointer;
  androidSensorsDEPRECATED @6 :AnyPointer;
  chffrAndroidExtraDEPRECATED @7 :AnyPointer;
  pandaInfo @8 :AnyPointer;
  dirty @9 :Bool;
  gitCommit @10 :Text;
  gitBranch @11 :Text;
  passive @12 :Bool;
  gitRemote @13 :Text;
  iosBuildInfoDEPRECATED @14 :AnyPointer;
  kernelVersion @15 :Text;
  androidProperties @16 :AnyPointer;
  params @17 :AnyPointer;
  osVersion @18 :Text;
  commands @19 :AnyPointer;
  wallTimeNanos @20 :UInt64;   # wall clock at logMonoTime, ns since the epoch
  gitCommitDate @21 :Text;
  bootlogId @22 :Text;

  enum DeviceType {
    unknown @0; neo @1; chffrAndroid @2; chffrIos @3; tici @4; pc @5; tizi @6; mici @7;
  }
}

struct FrameData {   # one camera frame: roadCameraState, wideRoadCameraState, driverCameraState
  frameId @0 :UInt32;
  encodeId @1 :UInt32;
  timestampEof @2 :UInt64;   # end of frame
  frameLengthDEPRECATED @3 :Int32;
  integLines @4 :Int32;
  globalGainDEPRECATED @5 :Int32;
  image @6 :Data;
  frameTypeDEPRECATED @7 :FrameTypeDEPRECATED;
  timestampSof @8 :UInt64;   # start of frame
  androidCaptureResultDEPRECATED @9 :AnyPointer;
  transform @10 :List(Float32);
  lensPosDEPRECATED @11 :Int32;
  lensSagDEPRECATED @12 :Float32;
  lensErrDEPRECATED @13 :Float32;
  lensTruePosDEPRECATED @14 :Float32;
  gain @15 :Float32;
  focusValDEPRECATED @16 :List(Int16);
  focusConfDEPRECATED @17 :List(UInt8);
  sharpnessScoreDEPRECATED @18 :List(UInt16);
  recoverStateDEPRECATED @19 :Int32;
  highConversionGain @20 :Bool;
  measuredGreyFraction @21 :Float32;
  targetGreyFraction @22 :Float32;
  processingTime @23 :Float32;   # s from end of frame to publish
  temperaturesC @24 :List(Float32);
  frameIdSensor @25 :UInt32;
  sensor @26 :ImageSensor;
  exposureValPercent @27 :Float32;
  requestId @28 :UInt32;

  enum FrameTypeDEPRECATED {
    unknown @0; neo @1; chffrAndroid @2; front @3;
  }
  enum ImageSensor {
    unknown @0; ar0231 @1; ox03c10 @2; os04c10 @3;
  }
}

struct DeviceState @0xa4d8b5af2aa492eb {   # explicit id, as openpilot
  cpu0DEPRECATED @0 :UInt16;
  cpu1DEPRECATED @1 :UInt16;
  cpu2DEPRECATED @2 :UInt16;
  cpu3DEPRECATED @3 :UInt16;
  memDEPRECATED @4 :UInt16;
  gpuDEPRECATED @5 :UInt16;
  batDEPRECATED @6 :UInt32;
  freeSpacePercent @7 :Float32;
  batteryPercentDEPRECATED @8 :Int16;
  batteryStatusDEPRECATED @9 :Text;
  fanSpeedPercentDesired @10 :UInt16;
  started @11 :Bool;
  usbOnlineDEPRECATED @12 :Bool;
  startedMonoTime @13 :UInt64;
  thermalStatus @14 :ThermalStatus;

  enum ThermalStatus {
    green @0; yellow @1; red @2; danger @3;
  }
}

struct EncodeIndex {   # where an encoded camera frame is: roadEncodeIdx, wideRoadEncodeIdx, driverEncodeIdx
  frameId @0 :UInt32;
  type @1 :Type;
  encodeId @2 :UInt32;         # frames encoded since the route started
  segmentNum @3 :Int32;        # the segment whose video file holds the frame
  segmentId @4 :UInt32;        # index of the frame in that file, presentation order
  segmentIdEncode @5 :UInt32;  # the same, encode order
  timestampSof @6 :UInt64;
  timestampEof @7 :UInt64;
  flags @8 :UInt32;            # V4L2 buffer flags: 8 (V4L2_BUF_FLAG_KEYFRAME) on a keyframe
  len @9 :UInt32;              # bytes of the encoded frame

  enum Type {
    bigBoxLossless @0; fullHEVC @1; bigBoxHEVCDEPRECATED @2; chffrAndroidH264DEPRECATED @3;
    fullLosslessClipDEPRECATED @4; frontDEPRECATED @5; qcameraH264 @6; livestreamH264 @7;
  }
}

struct EncodeData {   # an encoded camera frame, as openpilot's encoder publishes it (what its bridge carries off the device)
  idx @0 :EncodeIndex;
  data @1 :Data;                  # the frame's NAL units
  header @2 :Data;                # the codec's headers (VPS, SPS, PPS): on keyframes
  unixTimestampNanos @3 :UInt64;
  width @4 :UInt32;
  height @5 :UInt32;
}

struct LiveCalibrationData {
  warpMatrixDEPRECATED @0 :List(Float32);
  calStatusDEPRECATED @1 :Int8;
  calCycle @2 :Int32;
  calPerc @3 :Int8;
  extrinsicMatrix @4 :List(Float32);
  warpMatrix2DEPRECATED @5 :List(Float32);
  warpMatrixBigDEPRECATED @6 :List(Float32);
  rpyCalib @7 :List(Float32);          # device_from_calib roll, pitch, yaw
  rpyCalibSpread @8 :List(Float32);
  validBlocks @9 :Int32;
  wideFromDeviceEuler @10 :List(Float32);
  calStatus @11 :Status;
  height @12 :List(Float32);           # camera height above the road

  enum Status {
    uncalibrated @0; calibrated @1; invalid @2; recalibrating @3;
  }
}

struct LiveDelayData {
  lateralDelay @0 :Float32;            # s, steering actuation delay: the model's action is read this far ahead
  validBlocks @1 :Int32;
  status @2 :Status;
  lateralDelayEstimate @3 :Float32;
  points @4 :List(Float32);
  lateralDelayEstimateStd @5 :Float32;
  calPerc @6 :Int8;   # v0.11.1's last field (version @7 came later)

  enum Status {
    unestimated @0; estimated @1; invalid @2;
  }
}

enum LaneChangeState {
  off @0; preLaneChange @1; laneChangeStarting @2; laneChangeFinishing @3;
}

enum LaneChangeDirection {
  none @0; left @1; right @2;
}

struct XYZTData @0xc3cbae1fd505ae80 {   # explicit id, as openpilot
  x @0 :List(Float32);
  y @1 :List(Float32);
  z @2 :List(Float32);
  t @3 :List(Float32);
  xStd @4 :List(Float32);
  yStd @5 :List(Float32);
  zStd @6 :List(Float32);
}

struct ModelDataV2 {
  frameId @0 :UInt32;
  frameAge @1 :UInt32;            # frames between the frame modelled and the newest one seen
  frameDropPerc @2 :Float32;
  timestampEof @3 :UInt64;
  position @4 :XYZTData;          # the plan, on T_IDXS (t holds the times)
  orientation @5 :XYZTData;
  velocity @6 :XYZTData;
  orientationRate @7 :XYZTData;
  laneLines @8 :List(XYZTData);   # on X_IDXS (x holds the distances): left far, left, right, right far
  laneLineProbs @9 :List(Float32);
  roadEdges @10 :List(XYZTData);
  leads @11 :AnyPointer;
  meta @12 :MetaData;
  laneLineStds @13 :List(Float32);
  roadEdgeStds @14 :List(Float32);
  modelExecutionTime @15 :Float32;   # s, wall time of warp + model + copy-out
  rawPredictions @16 :Data;          # the flat float32 output vectors, when enabled
  gpuExecutionTimeDEPRECATED @17 :Float32;
  leadsV3 @18 :List(LeadDataV3);     # at 0, 2, 4 s
  acceleration @19 :XYZTData;
  frameIdExtra @20 :UInt32;          # frame id of the wide (extra) camera frame used
  temporalPose @21 :Pose;
  navEnabledDEPRECATED @22 :Bool;
  confidence @23 :ConfidenceClass;
  locationMonoTimeDEPRECATED @24 :UInt64;
  lateralPlannerSolutionDEPRECATED @25 :AnyPointer;
  action @26 :Action;

  struct LeadDataV3 {
    prob @0 :Float32;
    probTime @1 :Float32;
    t @2 :List(Float32);
    x @3 :List(Float32);
    xStd @4 :List(Float32);
    y @5 :List(Float32);
    yStd @6 :List(Float32);
    v @7 :List(Float32);
    vStd @8 :List(Float32);
    a @9 :List(Float32);
    aStd @10 :List(Float32);
  }

  struct MetaData {
    engagedProb @0 :Float32;
    desirePrediction @1 :List(Float32);   # 4 x 8, flattened
    brakeDisengageProbDEPRECATED @2 :Float32;
    gasDisengageProbDEPRECATED @3 :Float32;
    steerOverrideProbDEPRECATED @4 :Float32;
    desireState @5 :List(Float32);
    disengagePredictions @6 :DisengagePredictions;
    hardBrakePredicted @7 :Bool;
    laneChangeState @8 :LaneChangeState;
    laneChangeDirection @9 :LaneChangeDirection;
  }

  enum ConfidenceClass {
    red @0; yellow @1; green @2;
  }

  struct DisengagePredictions {
    t @0 :List(Float32);
    brakeDisengageProbs @1 :List(Float32);
    gasDisengageProbs @2 :List(Float32);
    steerOverrideProbs @3 :List(Float32);
    brake3MetersPerSecondSquaredProbs @4 :List(Float32);
    brake4MetersPerSecondSquaredProbs @5 :List(Float32);
    brake5MetersPerSecondSquaredProbs @6 :List(Float32);
    gasPressProbs @7 :List(Float32);
    brakePressProbs @8 :List(Float32);
  }

  struct Pose {
    trans @0 :List(Float32);   # m/s, device frame
    rot @1 :List(Float32);     # rad/s, device frame
    transStd @2 :List(Float32);
    rotStd @3 :List(Float32);
  }

  struct Action {
    desiredCurvature @0 :Float32;     # 1/m
    desiredAcceleration @1 :Float32;  # m/s^2
    shouldStop @2 :Bool;
  }
}

struct DrivingModelData {   # the small model message: what controls need, logged in qlogs
  frameId @0 :UInt32;
  frameIdExtra @1 :UInt32;
  action @2 :ModelDataV2.Action;
  laneLineMeta @3 :LaneLineMeta;
  meta @4 :MetaData;
  path @5 :PolyPath;
  frameDropPerc @6 :Float32;
  modelExecutionTime @7 :Float32;

  struct PolyPath {   # polynomial coefficients over T_IDXS, lowest power first
    xCoefficients @0 :List(Float32);
    yCoefficients @1 :List(Float32);
    zCoefficients @2 :List(Float32);
  }

  struct LaneLineMeta {
    leftY @0 :Float32;     # lateral position of the ego lane's lines at x = 0
    rightY @1 :Float32;
    leftProb @2 :Float32;
    rightProb @3 :Float32;
  }

  struct MetaData {
    laneChangeState @0 :LaneChangeState;
    laneChangeDirection @1 :LaneChangeDirection;
  }
}

struct CameraOdometry {
  trans @0 :List(Float32);       # m/s, device frame
  rot @1 :List(Float32);         # rad/s, device frame
  transStd @2 :List(Float32);
  rotStd @3 :List(Float32);
  frameId @4 :UInt32;
  timestampEof @5 :UInt64;
  wideFromDeviceEuler @6 :List(Float32);
  wideFromDeviceEulerStd @7 :List(Float32);
  roadTransformTrans @8 :List(Float32);
  roadTransformTransStd @9 :List(Float32);
}

struct DriverStateV2 {
  frameId @0 :UInt32;
  modelExecutionTime @1 :Float32;
  dspExecutionTimeDEPRECATED @2 :Float32;
  rawPredictions @3 :Data;
  poorVisionProb @4 :Float32;
  wheelOnRightProb @5 :Float32;
  leftDriverData @6 :DriverData;    # as if the driver sat on the left (LHD)
  rightDriverData @7 :DriverData;   # as if the driver sat on the right (RHD)
  gpuExecutionTime @8 :Float32;

  struct DriverData {
    faceOrientation @0 :List(Float32);     # pitch, yaw, roll
    faceOrientationStd @1 :List(Float32);
    facePosition @2 :List(Float32);        # x, y: offset from the image centre, fraction of the model frame
    facePositionStd @3 :List(Float32);
    faceProb @4 :Float32;
    leftEyeProb @5 :Float32;
    rightEyeProb @6 :Float32;
    leftBlinkProb @7 :Float32;
    rightBlinkProb @8 :Float32;
    sunglassesProb @9 :Float32;
    occludedProb @10 :Float32;
    readyProb @11 :List(Float32);
    notReadyProb @12 :List(Float32);
    phoneProb @13 :Float32;
    sleepProb @14 :Float32;
  }
}

struct SelfdriveState {   # what dmonitoringd reads of it: openpilot engaged or not
  state @0 :OpenpilotState;
  enabled @1 :Bool;
  active @2 :Bool;

  enum OpenpilotState @0xdbe58b96d2d1ac61 {
    disabled @0;
    preEnabled @1;
    enabled @2;
    softDisabling @3;
    overriding @4;   # the driver steers or presses the gas while engaged
  }
}

struct DriverMonitoringStateDEPRECATED @0xb83cda094a1da284 {   # Event @71, what openpilot published before v0.11.1
  eventsDEPRECATED @0 :AnyPointer;
  faceDetected @1 :Bool;
  isDistracted @2 :Bool;
  awarenessStatus @3 :Float32;      # 1 attentive .. 0 alert (-0.1 at most past it)
  isRHD @4 :Bool;
  rhdCheckedDEPRECATED @5 :Bool;
  posePitchOffset @6 :Float32;
  posePitchValidCount @7 :UInt32;
  poseYawOffset @8 :Float32;
  poseYawValidCount @9 :UInt32;
  stepChange @10 :Float32;
  awarenessActive @11 :Float32;
  awarenessPassive @12 :Float32;
  isLowStd @13 :Bool;
  hiStdCount @14 :UInt32;
  isPreviewDEPRECATED @15 :Bool;
  isActiveMode @16 :Bool;
  distractedType @17 :UInt32;       # bit mask
  events @18 :AnyPointer;
  uncertainCount @19 :UInt32;
}

struct DriverMonitoringState {   # Event @151, openpilot v0.11.1's (dmonitoringd/policy.py fills it)
  lockout @0 :Bool;                     # engaging refused: too many or too long terminal alerts this drive
  alertCountLockoutPercent @1 :Int8;    # terminal alerts so far, percent of the lockout's count
  alertTimeLockoutPercent @2 :Int8;     # time in terminal alerts so far, percent of the lockout's duration
  alwaysOn @3 :Bool;                    # monitoring while not engaged too
  alwaysOnLockout @4 :Bool;
  alertLevel @5 :AlertLevel;
  activePolicy @6 :MonitoringPolicy;
  isRHD @7 :Bool;                       # the driver sits on the right
  rhdCalibration @8 :CalibrationState;
  visionPolicyState @9 :VisionPolicyState;
  wheeltouchPolicyState @10 :WheeltouchPolicyState;

  enum AlertLevel {
    none @0;
    one @1;
    two @2;
    three @3;   # terminal: disengage
  }

  enum MonitoringPolicy {
    wheeltouch @0;   # no face the model is sure of: the driver shows attention by touching the wheel or the gas
    vision @1;       # the driver's face and eyes
  }

  struct VisionPolicyState {
    awarenessPercent @0 :Int8;   # 100 attentive .. 0 terminal
    awarenessStep @1 :Float32;   # awareness lost per frame while distracted (0 while this policy is not active)
    isDistracted @2 :Bool;
    distractedTypes @3 :DistractedTypes;
    faceDetected @4 :Bool;
    pose @5 :Pose;
    wheeltouchFallbackPercent @6 :Int8;      # how long the model has been unsure of the pose, percent of the fallback time
    uncertainOffroadAlertPercent @7 :Int8;   # how long the model has been unsure while moving, percent of the offroad alert's

    struct DistractedTypes {
      pose @0 :Bool;
      eye @1 :Bool;
      phone @2 :Bool;
    }

    struct Pose {
      pitch @0 :Float32;   # the face's, as seen from the road ahead (yaw flipped for a driver on the right)
      yaw @1 :Float32;
      pitchCalib @2 :CalibrationState;
      yawCalib @3 :CalibrationState;
      calibrated @4 :Bool;
      uncertainty @5 :Float32;   # the larger of the model's pitch and yaw stds
    }
  }

  struct WheeltouchPolicyState {
    awarenessPercent @0 :Int8;
    awarenessStep @1 :Float32;
    driverInteracting @2 :Bool;   # steering or gas pressed
  }

  struct CalibrationState {
    calibratedPercent @0 :Int8;   # samples so far, percent of those needed
    offset @1 :Float32;           # their filtered mean
  }
}
